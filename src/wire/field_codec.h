// Fields that several messages share, and how each is read and checked:
// counts that cannot promise more than the frame holds, floats, hyper-
// parameters, tensor declarations. Private to src/wire.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "wire/messages.h"

namespace tessera::wire::field {

Status Truncated(const char* what);

// Reads a count of items each at least `min_item_bytes` long, refusing counts
// the remaining bytes could not hold (so a lying count allocates nothing).
bool GetCount(ByteReader& r, size_t min_item_bytes, uint32_t* count);

template <size_t N>
bool GetArray(ByteReader& r, std::array<uint8_t, N>* out) {
  std::span<const uint8_t> bytes;
  if (!r.GetBytes(N, &bytes)) return false;
  std::copy(bytes.begin(), bytes.end(), out->begin());
  return true;
}

void PutFloat(MessageWriter& w, float f);
bool GetFloat(ByteReader& r, float* f);

constexpr size_t kHyperBytes = 7 * 4 + 1;
void PutHyper(MessageWriter& w, const Hyperparams& h);
Result<Hyperparams> GetHyper(ByteReader& r);

void PutDouble(MessageWriter& w, double d);
bool GetDouble(ByteReader& r, double* d);

constexpr size_t kModeBytes = 1 + 4 + 4 + 1 + 4;
void PutMode(MessageWriter& w, const ConsistencyMode& mode);
Result<ConsistencyMode> GetMode(ByteReader& r);
constexpr size_t kMinTensorDeclBytes = 4 + 1 + 1 + 1 + 4 + kHyperBytes + kModeBytes;
void PutTensorDecl(MessageWriter& w, const TensorDecl& t);
Result<TensorDecl> GetTensorDecl(ByteReader& r);

// A chunk of a tensor, checked to lie inside its shape.
constexpr size_t kMinCreateEntryBytes = kMinTensorDeclBytes + 24;
void PutCreateEntry(MessageWriter& w, const CreateEntry& e);
Result<CreateEntry> GetCreateEntry(ByteReader& r);

}  // namespace tessera::wire::field
