#include "support/loss_histories.hpp"

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include "support/paths.hpp"

namespace memfit::test {

namespace fs = std::filesystem;

namespace {

std::string dir() { return fixture_path("loss_histories"); }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

std::vector<float> decode(const nlohmann::json& hex) {
  std::vector<float> out;
  for (const auto& h : hex) out.push_back(std::bit_cast<float>(uint32_t(std::stoul(h.get<std::string>(), nullptr, 16))));
  return out;
}

nlohmann::json encode(const std::vector<float>& losses) {
  nlohmann::json out = nlohmann::json::array();
  for (float f : losses) out.push_back(fmt::format("{:08x}", std::bit_cast<uint32_t>(f)));
  return out;
}

std::string first_difference(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  if (got.size() != want.size()) return fmt::format("{} losses, recorded {}", got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = tolerance == 0 ? std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i])
                                     : std::abs(double(got[i]) - double(want[i])) <= tolerance * std::abs(double(want[i]));
    if (!same) return fmt::format("loss {} is {:.9g} ({:08x}), recorded {:.9g} ({:08x})", i, got[i],
                                  std::bit_cast<uint32_t>(got[i]), want[i], std::bit_cast<uint32_t>(want[i]));
  }
  return "";
}

}  // namespace

std::string host_fingerprint() {
  std::string isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    default: isa = fmt::format("isa{}", int(dnnl::get_effective_cpu_isa())); break;
  }
  std::string built = "built";
#ifdef __AVX512F__
  built += "-avx512";
#endif
#ifdef __AVX512BF16__
  built += "-bf16";
#endif
#ifdef __AMX_TILE__
  built += "-amx";
#endif
#ifdef __FMA__
  built += "-fma";
#endif
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return fmt::format("{}_{}_l2-{}k", isa, built, l2 > 0 ? l2 / 1024 : 0);
}

namespace {

// Every run against the records of the hosts other than `own`, to a relative tolerance; a run
// no other host recorded either is a problem.
std::vector<std::string> check_against_other_hosts(const std::string& suite, const LossHistories& runs, double tolerance,
                                                   const fs::path& own) {
  std::vector<std::string> problems;
  std::map<std::string, int> compared;
  for (const auto& entry : fs::directory_iterator(dir())) {
    if (entry.path() == own) continue;
    const nlohmann::json other = read_json(entry.path());
    if (!other.contains(suite)) continue;
    for (const auto& [name, losses] : runs) {
      if (!other[suite].contains(name)) continue;
      ++compared[name];
      const std::string d = first_difference(losses, decode(other[suite][name]), tolerance);
      if (!d.empty()) problems.push_back(fmt::format("{}: {} (host {})", name, d, entry.path().stem().string()));
    }
  }
  for (const auto& [name, losses] : runs)
    if (!compared.count(name)) problems.push_back(fmt::format("{}: no host has a record of it", name));
  return problems;
}

}  // namespace

std::vector<std::string> check_loss_histories(const std::string& suite, const LossHistories& runs, double tolerance) {
  const std::string host = host_fingerprint();
  const fs::path own = fs::path(dir()) / (host + ".json");
  std::vector<std::string> problems;
  const char* record = std::getenv("MEMFIT_RECORD_LOSS_HISTORIES");
  if (record && std::string(record) == "1") {
    nlohmann::json all = read_json(own);
    nlohmann::json& s = all[suite];
    s = nlohmann::json::object();
    for (const auto& [name, losses] : runs) s[name] = encode(losses);
    fs::create_directories(dir());
    std::ofstream(own) << all.dump(1) << "\n";
    std::cout << "recorded " << runs.size() << " loss histories of suite '" << suite << "' for host " << host << "\n";
    return problems;
  }
  const nlohmann::json mine = read_json(own);
  if (mine.contains(suite)) {
    const nlohmann::json& s = mine[suite];
    LossHistories unrecorded;
    for (const auto& [name, losses] : runs) {
      if (!s.contains(name)) {
        unrecorded[name] = losses;
        continue;
      }
      const std::string d = first_difference(losses, decode(s[name]), 0);
      if (!d.empty()) problems.push_back(fmt::format("{}: {} (bitwise, host {})", name, d, host));
    }
    for (const auto& [name, hex] : s.items())
      if (!runs.count(name)) problems.push_back(fmt::format("{}: recorded but not run", name));
    // A run this host has no record of (a kernel change that moved its bits was recorded on
    // another host only) is held to the other hosts' records, to the tolerance.
    if (!unrecorded.empty()) {
      std::cout << unrecorded.size() << " run(s) of suite '" << suite << "' have no bitwise record for host " << host
                << "; comparing them with the other hosts' records\n";
      for (const std::string& p : check_against_other_hosts(suite, unrecorded, tolerance, own)) problems.push_back(p);
    }
    return problems;
  }
  // No record for this host: every run must agree with some host's record to the tolerance.
  std::cout << "no bitwise record of suite '" << suite << "' for host " << host
            << "; comparing with the other hosts' records to a relative " << tolerance
            << " (MEMFIT_RECORD_LOSS_HISTORIES=1 records this host)\n";
  return check_against_other_hosts(suite, runs, tolerance, own);
}

}  // namespace memfit::test
