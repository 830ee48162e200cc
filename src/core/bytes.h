// Little-endian byte writer and bounds-checked reader. The reader never reads
// past its span: every Read* fails (and latches the failure) instead.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/pool_allocator.h"

namespace tessera {

// The pool's allocator for bytes that are written before they are read
// (a message being encoded or received): a resize leaves the new bytes as
// they are instead of zeroing them, so that appending n bytes costs one
// memcpy. (With any allocator but std::allocator, libstdc++ also copies a
// range into a vector byte by byte: the writer below resizes and copies.)
template <typename T>
struct UninitializedPoolAllocator : PoolAllocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedPoolAllocator<U>;
  };
  UninitializedPoolAllocator() = default;
  template <typename U>
  UninitializedPoolAllocator(  // NOLINT(google-explicit-constructor): rebinding
      const UninitializedPoolAllocator<U>&) {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;  // default-initialised: bytes stay as they are
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// The bytes of one message on the wire. Their memory comes from the pool
// (core/pool_allocator.h), because every call encodes one and a fabric frees
// it once sent: in steady state a call's message then costs no allocation.
using MessageBytes = std::vector<uint8_t, UninitializedPoolAllocator<uint8_t>>;

// Appends `bytes` to `out` with one resize and one memcpy, whatever the
// vector's allocator (use it, not insert, on a MessageBytes).
template <typename Bytes>
void AppendBytes(Bytes* out, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  const size_t at = out->size();
  out->resize(at + bytes.size());
  std::memcpy(out->data() + at, bytes.data(), bytes.size());
}

// A message holding a copy of `bytes`.
inline MessageBytes CopyToMessage(std::span<const uint8_t> bytes) {
  MessageBytes out;
  AppendBytes(&out, bytes);
  return out;
}

// `n` rounded up to a multiple of `alignment`.
constexpr uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

// FNV-1a, 64 bit: a cheap integrity check (not a MAC) for self-describing blobs.
uint64_t Fnv1a64(std::span<const uint8_t> bytes, uint64_t seed = 0xcbf29ce484222325ULL);

// Fixed-size little-endian fields written into, or read from, bytes whose
// bounds were checked once for the whole array (BasicByteWriter::Extend,
// ByteReader::GetFields): a message's per-entry fields then cost a store or
// a load each, not a resize or a bounds check each.
class FieldCursor {
 public:
  explicit FieldCursor(uint8_t* at) : at_(at) {}
  template <typename T>
  void Put(T value) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    auto v = static_cast<U>(value);
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(at_, &v, sizeof(U));
    } else {
      for (size_t i = 0; i < sizeof(U); ++i) at_[i] = static_cast<uint8_t>(v >> (8 * i));
    }
    at_ += sizeof(U);
  }

 private:
  uint8_t* at_;
};

class FieldReader {
 public:
  explicit FieldReader(const uint8_t* at = nullptr) : at_(at) {}
  template <typename T>
  T Get() {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    U v = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, at_, sizeof(U));
    } else {
      for (size_t i = 0; i < sizeof(U); ++i) v |= static_cast<U>(static_cast<U>(at_[i]) << (8 * i));
    }
    at_ += sizeof(U);
    return static_cast<T>(v);
  }

 private:
  const uint8_t* at_;
};

// Appends to a byte vector: a message's (MessageWriter) or any other
// (ByteWriter: a key's description, a file's header).
template <typename Bytes>
class BasicByteWriter {
  template <typename T, bool IsEnum>
  struct Underlying {
    using type = T;
  };
  template <typename T>
  struct Underlying<T, true> {
    using type = std::underlying_type_t<T>;
  };

 public:
  explicit BasicByteWriter(Bytes* out) : out_(out) {}

  template <typename T>
  void Put(T value) {
    static_assert(std::is_integral_v<T> || std::is_enum_v<T>);
    using U = std::make_unsigned_t<typename Underlying<T, std::is_enum_v<T>>::type>;
    auto v = static_cast<U>(value);
    if constexpr (std::endian::native == std::endian::little) {
      // One append of the value's bytes (the hot path encodes many).
      const size_t at = out_->size();
      out_->resize(at + sizeof(U));
      std::memcpy(out_->data() + at, &v, sizeof(U));
    } else {
      for (size_t i = 0; i < sizeof(U); ++i) out_->push_back(static_cast<uint8_t>(v >> (8 * i)));
    }
  }
  void PutBytes(std::span<const uint8_t> bytes) { AppendBytes(out_, bytes); }
  // `n` more bytes at once, for fixed-size fields the caller writes through
  // the cursor (exactly `n` bytes of them).
  FieldCursor Extend(size_t n) {
    const size_t at = out_->size();
    out_->resize(at + n);
    return FieldCursor(out_->data() + at);
  }
  // u32 length, then the bytes.
  void PutString(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    AppendBytes(out_, {reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  }
  void PutBlob(std::span<const uint8_t> bytes) {
    Put<uint32_t>(static_cast<uint32_t>(bytes.size()));
    PutBytes(bytes);
  }
  size_t size() const { return out_->size(); }
  // Overwrites a u32 at `offset` (for lengths known only at the end).
  void PatchU32(size_t offset, uint32_t value) {
    for (size_t i = 0; i < 4; ++i) (*out_)[offset + i] = static_cast<uint8_t>(value >> (8 * i));
  }

 private:
  Bytes* out_;
};
using ByteWriter = BasicByteWriter<std::vector<uint8_t>>;
using MessageWriter = BasicByteWriter<MessageBytes>;

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}

  template <typename T>
  bool Get(T* value) {
    static_assert(std::is_integral_v<T>);
    using U = std::make_unsigned_t<T>;
    if (!Need(sizeof(U))) return false;
    U v = 0;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, in_.data() + pos_, sizeof(U));
    } else {
      for (size_t i = 0; i < sizeof(U); ++i)
        v |= static_cast<U>(static_cast<U>(in_[pos_ + i]) << (8 * i));
    }
    pos_ += sizeof(U);
    *value = static_cast<T>(v);
    return true;
  }
  bool GetBytes(size_t n, std::span<const uint8_t>* out) {
    if (!Need(n)) return false;
    *out = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  // `n` bytes of fixed-size fields, read through `out` (at most `n` bytes
  // of them).
  bool GetFields(size_t n, FieldReader* out) {
    if (!Need(n)) return false;
    *out = FieldReader(in_.data() + pos_);
    pos_ += n;
    return true;
  }
  // A u32 length no larger than max_len, then that many bytes.
  bool GetString(std::string* out, size_t max_len) {
    std::span<const uint8_t> bytes;
    if (!GetBlob(&bytes, max_len)) return false;
    out->assign(bytes.begin(), bytes.end());
    return true;
  }
  bool GetBlob(std::span<const uint8_t>* out, size_t max_len) {
    uint32_t len = 0;
    if (!Get(&len)) return false;
    if (len > max_len) {
      failed_ = true;
      return false;
    }
    return GetBytes(len, out);
  }

  size_t remaining() const { return failed_ ? 0 : in_.size() - pos_; }
  size_t position() const { return pos_; }
  bool failed() const { return failed_; }

 private:
  bool Need(size_t n) {
    if (failed_ || n > in_.size() - pos_) {
      failed_ = true;
      return false;
    }
    return true;
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool failed_ = false;
};

}  // namespace tessera
