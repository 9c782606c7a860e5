#include "support/run_cli.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/paths.hpp"

namespace memfit::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string temp_dir() {
  static const std::string dir = [] {
    std::string d = "/tmp/memfit-test-" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

namespace {
CliResult run_command(const std::string& launcher_and_binary, const std::string& args) {
  static int counter = 0;
  const std::string base = temp_dir() + "/cli" + std::to_string(counter++);
  const std::string cmd = launcher_and_binary + " " + args + " >" + base + ".out 2>" + base + ".err";
  const int raw = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = read_file(base + ".out");
  r.err = read_file(base + ".err");
  return r;
}
}  // namespace

CliResult run_memfit(const std::string& args) { return run_command(memfit_binary(), args); }

CliResult run_memfit_mpi(int ranks, const std::string& args) {
  return run_command("OMP_NUM_THREADS=1 timeout -k 10 240 " + mpiexec() + " --allow-run-as-root --oversubscribe -np " +
                         std::to_string(ranks) + " " + memfit_binary(),
                     args);
}

}  // namespace memfit::test
