#include "fit/hardware.hpp"

#include <cmath>

#include "core/bytes.hpp"
#include "core/checked.hpp"
#include "core/error.hpp"
#include "core/system_memory.hpp"

namespace memfit {

namespace {

constexpr double GB = 1e9, TF = 1e12;
constexpr uint64_t kCublasWorkspaceHopper = 4096 * 8 * KiB, kCublasWorkspacePreHopper = 4096 * KiB * 2 + 16 * KiB * 8;

// A data-center GPU in an 8-GPU node: NVLink inside, one NIC per GPU between nodes.
Hardware gpu(std::string name, uint64_t mem, double bf16, double fp32, double bw, double nvlink, double nic,
             double pcie, uint64_t host) {
  Hardware h;
  h.name = std::move(name);
  h.memory_bytes = mem;
  h.peak_bf16_flops = bf16;
  h.peak_fp32_flops = fp32;
  h.memory_bandwidth = bw;
  h.intra_node_bandwidth = nvlink;
  h.inter_node_bandwidth = nic;
  h.host_link_bandwidth = pcie;
  h.host_memory_bandwidth = 200 * GB;
  h.disk_bandwidth = 6 * GB;
  h.host_memory_bytes = host;
  h.disk_bytes = uint64_t(8e12);
  // A CUDA context with PyTorch's kernels loaded takes ~0.5-1 GiB before the first tensor.
  h.framework_bytes = 1 * GiB;
  // PyTorch's cuBLAS workspace per handle (CublasHandlePool.cpp, parseChosenWorkspaceSize):
  // 4096 KiB x 8 on compute capability 9.x, 10.x and 12.x, else :4096:2:16:8.
  h.gemm_workspace_bytes = kCublasWorkspacePreHopper;
  h.collective_buffer_bytes = 512 * MiB;  // NCCL channels' buffers and its own workspace
  // Tensor cores multiply fp16 and bf16 natively: no fp32 islands for products under fp16.
  h.capabilities = tensor_core_gpu_capabilities(h.name);
  return h;
}

}  // namespace

Precision native_half_precision(const Hardware& hw) {
  const OpCapabilities& c = hw.capabilities;
  return !c.known() || c.supports(OpKind::matmul, DType::bf16) || !c.supports(OpKind::matmul, DType::f16)
             ? Precision::bf16
             : Precision::fp16;
}

std::vector<std::string> hardware_preset_names() {
  return {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb", "rtx4090-24gb", "l4-24gb", "a6000-48gb",
          "v100-32gb", "t4-16gb",   "cpu"};
}

Hardware hardware_preset(std::string_view name) {
  // Datasheet numbers, dense. Capacities as nvidia-smi reports them.
  if (name == "a100-40gb") return gpu("a100-40gb", 40 * GiB, 312 * TF, 19.5 * TF, 1555 * GB, 300 * GB, 25 * GB, 25 * GB, 1024 * GiB);
  if (name == "a100-80gb") return gpu("a100-80gb", 80 * GiB, 312 * TF, 19.5 * TF, 2039 * GB, 300 * GB, 25 * GB, 25 * GB, 2048 * GiB);
  if (name == "h100-80gb" || name == "h200-141gb") {
    Hardware h = name == "h100-80gb"
                     ? gpu("h100-80gb", 81559 * MiB, 989 * TF, 67 * TF, 3350 * GB, 450 * GB, 50 * GB, 50 * GB, 2048 * GiB)
                     : gpu("h200-141gb", 143771 * MiB, 989 * TF, 67 * TF, 4800 * GB, 450 * GB, 50 * GB, 50 * GB, 2048 * GiB);
    h.gemm_workspace_bytes = kCublasWorkspaceHopper;
    return h;
  }
  if (name == "rtx4090-24gb") {
    // Workstation card: no NVLink (PCIe between cards), Ethernet between machines.
    Hardware h = gpu("rtx4090-24gb", 24564 * MiB, 165 * TF, 82.6 * TF, 1008 * GB, 25 * GB, 12.5 * GB, 25 * GB, 128 * GiB);
    h.host_memory_bandwidth = 60 * GB;
    return h;
  }
  if (name == "l4-24gb") {
    Hardware h = gpu("l4-24gb", 23034 * MiB, 121 * TF, 30.3 * TF, 300 * GB, 25 * GB, 12.5 * GB, 25 * GB, 192 * GiB);
    return h;
  }
  if (name == "a6000-48gb") {
    // RTX A6000, the QLoRA paper's 48 GB GPU: 154.8 TFLOP/s dense bf16 (309.7 is with
    // sparsity), 38.7 TFLOP/s fp32, 768 GB/s GDDR6; NVLink bridges pairs only, so PCIe 4.0.
    Hardware h = gpu("a6000-48gb", 49140 * MiB, 154.8 * TF, 38.7 * TF, 768 * GB, 25 * GB, 12.5 * GB, 25 * GB, 256 * GiB);
    h.host_memory_bandwidth = 100 * GB;
    return h;
  }
  // Before Ampere: fp16 tensor cores, no bf16 products (peak_bf16_flops holds the 16-bit peak,
  // fp16's); PCIe 3.0.
  if (name == "v100-32gb") {
    // V100 SXM2 32 GB (a DGX-1): 125 TFLOP/s fp16 tensor, 15.7 fp32, 900 GB/s HBM2; NVLink 2
    // 300 GB/s per GPU in all (150 each way); 4 x 100 Gb/s NICs per 8 GPUs.
    Hardware h = gpu("v100-32gb", 32510 * MiB, 125 * TF, 15.7 * TF, 900 * GB, 150 * GB, 6.25 * GB, 12.5 * GB, 512 * GiB);
    h.host_memory_bandwidth = 100 * GB;
    h.capabilities = pre_ampere_gpu_capabilities(h.name);
    return h;
  }
  if (name == "t4-16gb") {
    // T4 (Colab, a g4dn node of 4): 65 TFLOP/s fp16 tensor, 8.1 fp32, 320 GB/s GDDR6; PCIe
    // between cards, 50 Gb/s between nodes.
    Hardware h = gpu("t4-16gb", 15360 * MiB, 65 * TF, 8.1 * TF, 320 * GB, 12.5 * GB, 6.25 * GB, 12.5 * GB, 192 * GiB);
    h.host_memory_bandwidth = 100 * GB;
    h.capabilities = pre_ampere_gpu_capabilities(h.name);
    return h;
  }
  if (name == "cpu") {
    // This machine: memory is host RAM (the device tier of the CPU backend). The speeds below
    // are the Sapphire Rapids development machine's (fp32 products ~310 GFLOP/s on 2 cores,
    // bf16 on AMX ~1.4 TFLOP/s): `memfit plan` replaces them with this machine's, measured by
    // kernels/cpu/speed_probe. No framework context: plans are exact.
    Hardware h;
    h.name = "cpu";
    h.memory_bytes = total_memory_bytes();
    h.peak_fp32_flops = 310e9;
    h.peak_bf16_flops = 1.4e12;
    h.memory_bandwidth = 20 * GB;
    h.intra_node_bandwidth = 10 * GB;
    h.inter_node_bandwidth = 1.25 * GB;
    h.host_link_bandwidth = 20 * GB;
    h.host_memory_bandwidth = 20 * GB;
    h.disk_bandwidth = 1 * GB;
    h.host_memory_bytes = h.memory_bytes;
    h.disk_bytes = 100 * GiB;
    h.executes_here = true;
    h.default_efficiency = 1.0;
    // capabilities stay unknown: they are the backend's that runs here, which the caller
    // (cli/hardware_plan.cpp) fills in; fit/ cannot name a backend.
    return h;
  }
  std::string known;
  for (const std::string& n : hardware_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("hardware", fmt::format("unknown hardware '{}' (presets: {}; or a JSON file with --hardware-file)", name, known));
}

void Hardware::validate() const {
  MEMFIT_CHECK(memory_bytes > 0, "hardware", "{}: memory_bytes must be positive", name);
  for (auto [v, field] : {std::pair{peak_bf16_flops, "peak_bf16_flops"}, {peak_fp32_flops, "peak_fp32_flops"},
                          {memory_bandwidth, "memory_bandwidth"}, {intra_node_bandwidth, "intra_node_bandwidth"},
                          {inter_node_bandwidth, "inter_node_bandwidth"}, {host_link_bandwidth, "host_link_bandwidth"},
                          {host_memory_bandwidth, "host_memory_bandwidth"}, {disk_bandwidth, "disk_bandwidth"}})
    MEMFIT_CHECK(v > 0, "hardware", "{}: {} must be positive (got {})", name, field, v);
}

void apply_hardware_json(const nlohmann::json& j, Hardware& hw, const std::string& where) {
  MEMFIT_CHECK(j.is_object(), "hardware", "{}: expected a JSON object", where);
  // Sizes as bytes or as people write them ("80GiB"), at most one tier's bound (1 PiB).
  auto bytes = [&](const nlohmann::json& v, const std::string& key) -> uint64_t {
    const std::string field = where + ": " + key;
    if (v.is_string()) {
      const uint64_t b = parse_bytes(v.get<std::string>(), field);
      MEMFIT_CHECK(b <= kMaxTierBytes, "hardware", "{}: {} bytes is above 1 PiB, more than any machine has", field, b);
      return b;
    }
    MEMFIT_CHECK(v.is_number() && v.get<double>() >= 0 && v.get<double>() <= double(kMaxTierBytes), "hardware",
                 "{} must be bytes up to 1 PiB (a number or \"80GiB\"; got {})", field, v.dump());
    return v.is_number_integer() ? v.get<uint64_t>() : uint64_t(v.get<double>());
  };
  auto number = [&](const nlohmann::json& v, const std::string& key) {
    MEMFIT_CHECK(v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>()), "hardware",
                 "{}: '{}' must be a positive number (got {})", where, key, v.dump());
    return v.get<double>();
  };
  if (j.contains("base")) {  // a preset the other keys override, whatever their order
    MEMFIT_CHECK(j["base"].is_string(), "hardware", "{}: 'base' must name a preset", where);
    hw = hardware_preset(j["base"].get<std::string>());
  }
  for (const auto& [key, v] : j.items()) {
    if (key == "base") continue;
    if (key == "name") hw.name = v.get<std::string>();
    else if (key == "memory_bytes") hw.memory_bytes = bytes(v, key);
    else if (key == "host_memory_bytes") hw.host_memory_bytes = bytes(v, key);
    else if (key == "disk_bytes") hw.disk_bytes = bytes(v, key);
    else if (key == "framework_bytes") hw.framework_bytes = bytes(v, key);
    else if (key == "gemm_workspace_bytes") hw.gemm_workspace_bytes = bytes(v, key);
    else if (key == "collective_buffer_bytes") hw.collective_buffer_bytes = bytes(v, key);
    else if (key == "peak_bf16_flops") hw.peak_bf16_flops = number(v, key);
    else if (key == "peak_fp32_flops") hw.peak_fp32_flops = number(v, key);
    else if (key == "memory_bandwidth") hw.memory_bandwidth = number(v, key);
    else if (key == "intra_node_bandwidth") hw.intra_node_bandwidth = number(v, key);
    else if (key == "inter_node_bandwidth") hw.inter_node_bandwidth = number(v, key);
    else if (key == "host_link_bandwidth") hw.host_link_bandwidth = number(v, key);
    else if (key == "host_memory_bandwidth") hw.host_memory_bandwidth = number(v, key);
    else if (key == "disk_bandwidth") hw.disk_bandwidth = number(v, key);
    else if (key == "speeds_measured") {  // as hardware_json writes it, so its output reads back
      MEMFIT_CHECK(v.is_boolean(), "hardware", "{}: 'speeds_measured' must be true or false", where);
      hw.speeds_measured = v.get<bool>();
    }
    else throw Error("hardware", fmt::format("{}: unknown key '{}'", where, key));
  }
}

nlohmann::json hardware_json(const Hardware& h) {
  return {{"name", h.name},
          {"memory_bytes", h.memory_bytes},
          {"peak_bf16_flops", h.peak_bf16_flops},
          {"peak_fp32_flops", h.peak_fp32_flops},
          {"memory_bandwidth", h.memory_bandwidth},
          {"intra_node_bandwidth", h.intra_node_bandwidth},
          {"inter_node_bandwidth", h.inter_node_bandwidth},
          {"host_link_bandwidth", h.host_link_bandwidth},
          {"host_memory_bandwidth", h.host_memory_bandwidth},
          {"disk_bandwidth", h.disk_bandwidth},
          {"host_memory_bytes", h.host_memory_bytes},
          {"disk_bytes", h.disk_bytes},
          {"framework_bytes", h.framework_bytes},
          {"gemm_workspace_bytes", h.gemm_workspace_bytes},
          {"collective_buffer_bytes", h.collective_buffer_bytes},
          {"speeds_measured", h.speeds_measured}};
}

}  // namespace memfit
