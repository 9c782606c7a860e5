// One-line, printable text for JSON parse errors. nlohmann's messages quote the bytes last
// read, which in a corrupt file may be binary; memfit's errors must stay one readable line.
#pragma once

#include <exception>
#include <string>

namespace memfit {

// e.what() with every byte outside printable ASCII written as \xNN.
std::string printable_error_text(const std::exception& e);

}  // namespace memfit
