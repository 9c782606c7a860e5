// Hardware a run is planned for: one accelerator's memory and speed, how ranks are connected,
// and the fixed bytes a real run pays outside memfit's program (the framework's context, the
// GEMM library's workspace, the collective library's buffers). Presets carry datasheet
// numbers (dense, no sparsity); every field can be overridden by a JSON file and by flags.
//
// Subtle point: bandwidths are per direction and per rank (inter-node: one NIC per GPU), as
// ring collectives use them; capacity is what the device reports, in bytes (GiB on GPUs).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "graph/capabilities.hpp"
#include "graph/policy.hpp"

namespace memfit {

struct Hardware {
  std::string name;
  uint64_t memory_bytes = 0;        // device memory per rank
  double peak_bf16_flops = 0;       // dense tensor-core (16-bit) FLOP/s
  double peak_fp32_flops = 0;       // FLOP/s of fp32 GEMMs (no TF32)
  double memory_bandwidth = 0;      // device memory, bytes/s
  double intra_node_bandwidth = 0;  // between ranks of a node, bytes/s per direction
  double inter_node_bandwidth = 0;  // between nodes, bytes/s per rank per direction
  double host_link_bandwidth = 0;   // device <-> host (PCIe), bytes/s per rank per direction
  double host_memory_bandwidth = 0; // host DRAM of one node (CPU optimizer steps), bytes/s
  double disk_bandwidth = 0;        // NVMe of one node, bytes/s
  uint64_t host_memory_bytes = 0;   // per node
  uint64_t disk_bytes = 0;          // per node
  // Fixed runtime overheads per rank.
  uint64_t framework_bytes = 0;         // CUDA context, framework allocator state
  uint64_t gemm_workspace_bytes = 0;    // cuBLAS workspace
  uint64_t collective_buffer_bytes = 0; // NCCL buffers (only when world size > 1)
  bool executes_here = false;       // this machine: plans are exact (CPU backend scratch attached)
  // Share of peak FLOP/s compute-bound ops reach when the user does not say (--efficiency): a
  // typical large-model training MFU on GPU datasheet peaks; 1 on "cpu", whose peaks the CLI
  // replaces with the backend's own measured product rates (kernels/cpu/speed_probe.hpp).
  double default_efficiency = 0.45;
  bool speeds_measured = false;     // peaks and bandwidths timed on this machine, not a datasheet's
  // What the device computes natively; the precision pass builds the planned program for it.
  // GPU presets: tensor_core_gpu_capabilities; "cpu": unknown until the caller sets the
  // capabilities of the backend that runs here (plan_summary refuses a 16-bit plan without).
  OpCapabilities capabilities;

  double peak_flops(DType compute) const { return compute == DType::f32 ? peak_fp32_flops : peak_bf16_flops; }
  void validate() const;  // throws [hardware] naming the field
};

// The 16-bit precision the device multiplies natively: bf16, or fp16 where its products have no
// bf16 kernels (V100, T4: a bf16 run there computes its products as fp32 islands); bf16 while
// its capabilities are unknown.
Precision native_half_precision(const Hardware& hw);

std::vector<std::string> hardware_preset_names();
Hardware hardware_preset(std::string_view name);  // throws [hardware] listing the presets

// Keys as the field names above (numbers; byte sizes also as strings like "80GiB").
void apply_hardware_json(const nlohmann::json& j, Hardware& hw, const std::string& where);
nlohmann::json hardware_json(const Hardware& hw);

// Data-parallel layout of the run.
struct Cluster {
  Hardware hw;
  int gpus_per_node = 1;
  int nodes = 1;
  int world_size() const { return gpus_per_node * nodes; }
  // Ring collectives are paced by the slowest link they cross.
  double collective_bandwidth() const { return nodes > 1 ? hw.inter_node_bandwidth : hw.intra_node_bandwidth; }
  uint64_t fixed_overhead_bytes() const {
    return hw.framework_bytes + hw.gemm_workspace_bytes + (world_size() > 1 ? hw.collective_buffer_bytes : 0);
  }
};

}  // namespace memfit
