// Structural checks of a torch pickle archive before LibTorch reads it. LibTorch 1.13 believes the
// sizes written in the file: a corrupt zip entry can make it allocate an entry's claimed size, and a
// corrupt memo index in the pickle makes its unpickler allocate a memo table that large (tens of
// GB from a 24 KB file — found by fuzzing the checkpoint loader). These checks bound every size by
// the file itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace muon::detail {

// CRC-32 (IEEE 802.3, the zip format's) of `size` bytes.
uint32_t crc32(const char* data, uint64_t size);

// Throws muon::Error naming the first inconsistency: every zip entry stored uncompressed (as
// torch writes them), inside the file and matching its CRC-32; the central directory inside the
// file.
void check_zip_structure(const std::vector<char>& bytes);

// Throws muon::Error unless `pickle` could have been written by LibTorch's pickler for a
// checkpoint: only the opcodes and globals it uses, every argument inside the pickle, every memo
// index at most the number memoized, and — simulating the unpickler's stack — every opcode finding
// the items it takes (a dict to fill, a tensor's six arguments, one value left at STOP). LibTorch
// 1.13's unpickler checks none of this and corrupts memory on such input (found by fuzzing).
void check_pickle_structure(const std::string& pickle);

}  // namespace muon::detail
