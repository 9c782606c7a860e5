// Runs the built memfit binary with arguments and captures its exit status and output.
#pragma once

#include <string>

namespace memfit::test {

struct CliResult {
  int status = -1;  // exit status
  std::string out, err;
};

CliResult run_memfit(const std::string& args);
// The same under mpirun with `ranks` ranks of one thread each (a 240 s limit).
CliResult run_memfit_mpi(int ranks, const std::string& args);
std::string read_file(const std::string& path);
std::string temp_dir();  // a fresh directory under /tmp for this test process
void write_file(const std::string& path, const std::string& bytes);

}  // namespace memfit::test
