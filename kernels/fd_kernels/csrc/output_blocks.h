// Memory for op outputs of many megabytes (an LM head over hundreds of prompt rows): one freed block is
// kept for the next output of about its size, so repeated calls write into pages already mapped instead
// of faulting, clearing and charging every page of a fresh mapping each call (glibc maps blocks this
// large by themselves and unmaps them on free).
#pragma once
#include <cstdint>

#include "paddle/extension.h"

namespace fdk {

// Outputs of at least this many bytes come from output_block; smaller ones from Paddle's allocator.
constexpr int64_t kOutputBlockMinBytes = int64_t{32} << 20;

// An uninitialized fp32 CPU tensor of `shape` (at least kOutputBlockMinBytes) on page-aligned memory with
// huge-page advice: the kept block when it fits, else a fresh mapping. Its memory goes back to the keeper
// when the tensor's last reference is dropped, never while the tensor lives.
paddle::Tensor output_block(const std::vector<int64_t>& shape);

}  // namespace fdk
