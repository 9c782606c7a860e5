// libFuzzer target: parse_checkpoint_manifest on arbitrary text, as given and re-signed (the
// input parsed as JSON and given the XXH3 checksum the writer would write, so that mutations
// reach the field checks behind the checksum). A manifest it accepts must format and parse
// back to one that formats identically.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.hpp"
#include "train/checkpoint_manifest.hpp"

namespace {

void parse_and_round_trip(std::string_view text) {
  try {
    const memfit::CheckpointManifest m = memfit::parse_checkpoint_manifest(text);
    const std::string formatted = memfit::format_checkpoint_manifest(m);
    if (memfit::format_checkpoint_manifest(memfit::parse_checkpoint_manifest(formatted)) != formatted) std::abort();
  } catch (const memfit::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  parse_and_round_trip(text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 0;
  j.erase("checksum");
  std::string body;
  try {
    body = j.dump();
  } catch (const nlohmann::json::exception&) {
    return 0;  // invalid UTF-8 in a string: the writer never produces it, the raw pass covered it
  }
  j["checksum"] = "xxh3:" + fmt::format("{:016x}", XXH3_64bits(body.data(), body.size()));
  parse_and_round_trip(j.dump(2));
  return 0;
}
