// Structural checks of a torch pickle archive before LibTorch reads it. LibTorch 1.13 believes the
// sizes written in the file: a corrupt zip entry can make it allocate an entry's claimed size, and a
// corrupt memo index in the pickle makes its unpickler allocate a memo table that large (tens of
// GB from a 24 KB file — found by fuzzing the checkpoint loader). These checks bound every size by
// the file itself.
#pragma once

#include <string>
#include <vector>

namespace muon::detail {

// Throws muon::Error naming the first inconsistency: every zip entry stored uncompressed (as
// torch writes them) and inside the file, the central directory inside the file.
void check_zip_structure(const std::vector<char>& bytes);

// Throws muon::Error unless `pickle` is a sequence of known opcodes whose arguments lie inside it,
// ending in STOP, with every memo index at most the number of values memoized before it.
void check_pickle_structure(const std::string& pickle);

}  // namespace muon::detail
