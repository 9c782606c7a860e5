// Runs the built memfit binary with arguments and captures its exit status and output.
#pragma once

#include <string>

namespace memfit::test {

struct CliResult {
  int status = -1;  // exit status
  std::string out, err;
};

CliResult run_memfit(const std::string& args);
std::string temp_dir();  // a fresh directory under /tmp for this test process
void write_file(const std::string& path, const std::string& bytes);

}  // namespace memfit::test
