#include "support/run_cli.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/paths.hpp"

namespace memfit::test {

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

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

CliResult run_memfit(const std::string& args) {
  static int counter = 0;
  const std::string base = temp_dir() + "/cli" + std::to_string(counter++);
  const std::string cmd = memfit_binary() + " " + args + " >" + base + ".out 2>" + base + ".err";
  const int raw = std::system(cmd.c_str());
  CliResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

}  // namespace memfit::test
