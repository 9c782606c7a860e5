// Recorded loss histories: the bit patterns of every training and validation loss of a set of
// runs, kept in tests/fixtures/loss_histories/<host>.json. Refactors must leave them bitwise
// unchanged. The bits depend on the kernels this host runs (oneDNN picks AMX, AVX512-BF16 or
// AVX2 code and blocks for the caches), so each record belongs to a host fingerprint; on a
// host without a record the runs are compared with every record to a tolerance instead, and
// the test says so. MEMFIT_RECORD_LOSS_HISTORIES=1 writes this host's record.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace memfit::test {

// oneDNN's effective ISA, the vector extensions memfit was compiled for, and the L2 size.
std::string host_fingerprint();

using LossHistories = std::map<std::string, std::vector<float>>;  // run name -> losses

// Compares `runs` with the record of `suite` for this host (bitwise) or, without one, with
// every host's record (relative tolerance `tolerance`); records them when asked. Returns a
// description of every mismatch (empty: all equal).
std::vector<std::string> check_loss_histories(const std::string& suite, const LossHistories& runs,
                                              double tolerance);

}  // namespace memfit::test
