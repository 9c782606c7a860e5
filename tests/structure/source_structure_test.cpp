// The shape of the source tree, checked on every build: the pieces of src/ depend on each other
// only downwards (the table below, which docs/ARCHITECTURE.md draws), no file in src/ is over
// 600 lines, and no function is over 120 lines. The function check reads the code itself:
// comments and string literals are blanked, then every brace that opens a body at namespace
// or class scope after a parameter list `)` (a function, a constructor, an operator) is
// matched with its closing brace. Lambdas and local classes count towards the function that
// holds them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// Each piece and the pieces it may include. A piece may always include itself.
const std::map<std::string, std::set<std::string>>& allowed_dependencies() {
  static const std::map<std::string, std::set<std::string>> deps = {
      {"core", {}},
      {"graph", {"core"}},
      {"plan", {"core", "graph"}},
      {"memory", {"core", "graph"}},
      {"kernels", {"core", "graph", "memory"}},
      {"dist", {"core"}},
      {"io", {"core", "graph"}},
      {"text", {"core", "io"}},
      {"runtime", {"core", "graph", "plan", "memory", "kernels", "dist"}},
      {"fit", {"core", "graph", "plan"}},
      {"train", {"core", "graph", "plan", "memory", "kernels", "dist", "io", "text", "runtime", "fit"}},
      {"cli", {"core", "graph", "plan", "memory", "kernels", "dist", "io", "text", "runtime", "fit", "train"}},
  };
  return deps;
}

constexpr int kMaxFileLines = 600;
constexpr int kMaxFunctionLines = 120;

const fs::path kSrc = MEMFIT_SOURCE_DIR;

std::vector<fs::path> source_files() {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(kSrc))
    if (e.is_regular_file() && (e.path().extension() == ".cpp" || e.path().extension() == ".hpp")) out.push_back(e.path());
  return out;
}

std::string piece_of(const fs::path& file) { return fs::relative(file, kSrc).begin()->string(); }

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Comments, string and character literals become spaces; newlines stay, so line numbers hold.
std::string blank_comments_and_literals(const std::string& s) {
  std::string out = s;
  enum { code, line_comment, block_comment, str, chr, raw } state = code;
  std::string raw_end;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i], n = i + 1 < s.size() ? s[i + 1] : '\0';
    auto blank = [&](size_t k) {
      if (out[k] != '\n') out[k] = ' ';
    };
    switch (state) {
      case code:
        if (c == '/' && n == '/') state = line_comment, blank(i);
        else if (c == '/' && n == '*') state = block_comment, blank(i);
        else if (c == 'R' && n == '"' && (i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1])))) {
          const size_t open = s.find('(', i);
          raw_end.assign(1, ')');
          raw_end.append(s, i + 2, open - i - 2);
          raw_end.push_back('"');
          state = raw;
          i = open;
        } else if (c == '"') state = str;
        else if (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(s[i - 1])))) state = chr;
        break;
      case line_comment:
        if (c == '\n') state = code;
        else blank(i);
        break;
      case block_comment:
        blank(i);
        if (c == '*' && n == '/') blank(i + 1), ++i, state = code;
        break;
      case str:
      case chr:
        if (c == '\\') blank(i), blank(i + 1), ++i;
        else if (c == (state == str ? '"' : '\'')) state = code;
        else blank(i);
        break;
      case raw:
        if (s.compare(i, raw_end.size(), raw_end) == 0) i += raw_end.size() - 1, state = code;
        else blank(i);
        break;
    }
  }
  return out;
}

struct Body {
  int first_line, last_line;
  std::string head;
};

// Function bodies opened at namespace or class scope.
std::vector<Body> function_bodies(const std::string& code) {
  enum class Scope { ns, cls, function, block };
  std::vector<Scope> scopes;
  std::vector<int> open_line;
  std::vector<std::string> heads;
  std::vector<Body> out;
  std::string since;  // the text since the last ';', '{' or '}'
  int line = 1;
  for (char c : code) {
    if (c == '\n') ++line;
    if (c == '{') {
      const bool outer = scopes.empty() || scopes.back() == Scope::ns || scopes.back() == Scope::cls;
      static const std::regex ns_re(R"((^|\W)namespace(\s+[\w:]+)?\s*$)");
      static const std::regex cls_re(R"((^|\W)(class|struct|union|enum)\b[^()]*$)");
      static const std::regex fn_re(R"(\)[^()]*$)");
      static const std::regex init_re(R"(=\s*$)");
      Scope s = Scope::block;
      if (outer) {
        if (std::regex_search(since, ns_re) || since.find("extern \"C\"") != std::string::npos) s = Scope::ns;
        else if (std::regex_search(since, cls_re)) s = Scope::cls;
        else if (std::regex_search(since, fn_re) && !std::regex_search(since, init_re)) s = Scope::function;
      }
      scopes.push_back(s);
      open_line.push_back(line);
      heads.push_back(since);
      since.clear();
    } else if (c == '}') {
      if (!scopes.empty()) {
        if (scopes.back() == Scope::function) {
          std::string head = heads.back();
          head.erase(0, head.find_first_not_of(" \n\t"));
          out.push_back({open_line.back(), line, head.substr(0, 120)});
        }
        scopes.pop_back();
        open_line.pop_back();
        heads.pop_back();
      }
      since.clear();
    } else if (c == ';') {
      since.clear();
    } else {
      since += c;
    }
  }
  return out;
}

TEST(SourceStructure, PiecesIncludeOnlyThePiecesBelowThem) {
  const std::regex include_re(R"re(#include\s+"([a-z_]+)/)re");
  int checked = 0;
  for (const fs::path& f : source_files()) {
    const std::string piece = piece_of(f);
    auto it = allowed_dependencies().find(piece);
    ASSERT_NE(it, allowed_dependencies().end()) << "src/" << piece << " is not in the layer table";
    const std::string text = read(f);
    for (std::sregex_iterator m(text.begin(), text.end(), include_re), end; m != end; ++m) {
      const std::string dep = (*m)[1];
      if (dep == piece || !allowed_dependencies().count(dep)) continue;
      ++checked;
      EXPECT_TRUE(it->second.count(dep)) << fs::relative(f, kSrc).string() << " (" << piece << ") includes " << dep
                                         << "/, a piece that is not below it";
    }
  }
  EXPECT_GT(checked, 100);  // the scan found the includes
}

// Kernels fork only through kernels/cpu/parallel.hpp's parallel_for: libgomp mallocs a team
// for every region that runs on one thread, and nothing may allocate inside a step.
TEST(SourceStructure, KernelsForkOnlyThroughParallelFor) {
  int kernels = 0;
  for (const fs::path& f : source_files()) {
    const std::string rel = fs::relative(f, kSrc).string();
    if (!rel.starts_with("kernels/") || rel == "kernels/cpu/parallel.hpp") continue;
    ++kernels;
    EXPECT_EQ(blank_comments_and_literals(read(f)).find("omp parallel"), std::string::npos)
        << rel << " opens an OpenMP region of its own: use parallel_for";
  }
  EXPECT_GT(kernels, 30);
}

TEST(SourceStructure, NoFileOver600Lines) {
  for (const fs::path& f : source_files()) {
    const std::string text = read(f);
    const long lines = std::count(text.begin(), text.end(), '\n');
    EXPECT_LE(lines, kMaxFileLines) << fs::relative(f, kSrc).string();
  }
}

TEST(SourceStructure, NoFunctionOver120Lines) {
  int functions = 0;
  for (const fs::path& f : source_files()) {
    for (const Body& b : function_bodies(blank_comments_and_literals(read(f)))) {
      ++functions;
      EXPECT_LE(b.last_line - b.first_line + 1, kMaxFunctionLines)
          << fs::relative(f, kSrc).string() << ":" << b.first_line << ": " << b.head;
    }
  }
  EXPECT_GT(functions, 500);  // the scan found the functions
}

// The scanner itself, on code whose answer is known.
TEST(SourceStructure, TheFunctionScannerFindsBodiesAndSkipsTheRest) {
  const std::string code = R"cpp(
namespace a {
struct S {
  int f() const { return 1; }
  int x = 2;
};
// a comment with { braces
int g(int y) {
  auto l = [&](int z) { return z + y; };
  if (y) { return l(1); }
  const char* s = "}{";
  return 0;
}
std::vector<int> v = {1, 2};
enum class E { a, b };
}  // namespace a
)cpp";
  const std::vector<Body> bodies = function_bodies(blank_comments_and_literals(code));
  ASSERT_EQ(bodies.size(), 2u);
  EXPECT_EQ(bodies[0].first_line, 4);
  EXPECT_EQ(bodies[0].last_line, 4);
  EXPECT_EQ(bodies[1].first_line, 8);
  EXPECT_EQ(bodies[1].last_line, 13);
}

}  // namespace
