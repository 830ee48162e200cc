// The AEAD that protects a tcp session after its handshake: AES-256-GCM
// (gcm_engine.h: IPsec-MB or OpenSSL), one key and one base IV per direction, derived from the
// handshake (wire/handshake.h). Every record takes the next nonce of its
// direction (base IV xor a 64-bit sequence number, as TLS 1.3 builds it),
// so a record dropped, replayed or moved fails the next check. A message
// is one record (header and body, one tag: one AEAD pass per message); a
// put's, get's or answer's header is a record of its own, checked before
// the target touches memory, and its payload (if any) another.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tessera/status.h"
#include "transport/tcp/gcm_engine.h"
#include "transport/transport.h"

namespace tessera::transport::tcp {

constexpr size_t kSealTagBytes = kGcmTagBytes;

class SessionCipher {
 public:
  enum class Direction : uint8_t { kSeal, kOpen };
  struct Options {
    Direction direction = Direction::kSeal;
    // false: records are authenticated only (GMAC over the bytes, which
    // travel as they are).
    bool encrypt = true;
    GcmLibrary library = GcmLibrary::kFastest;
  };
  static Result<std::unique_ptr<SessionCipher>> Create(const SessionKeys::Half& keys,
                                                       const Options& options);
  ~SessionCipher();
  std::string library_name() const { return engine_->library_name(); }
  SessionCipher(const SessionCipher&) = delete;
  SessionCipher& operator=(const SessionCipher&) = delete;

  // A record in pieces: Begin, Update for each piece (out may equal in),
  // then EndSeal writes the tag or EndOpen checks it (false: the record
  // was altered, or is not the one due).
  void Begin();
  void Update(const uint8_t* in, uint8_t* out, size_t len) { engine_->Update(in, out, len); }
  void EndSeal(uint8_t tag[kSealTagBytes]) { engine_->EndSeal(tag); }
  [[nodiscard]] bool EndOpen(const uint8_t tag[kSealTagBytes]) { return engine_->EndOpen(tag); }

  // A whole record at once: `len` bytes, then the tag after them in `out`.
  void Seal(const uint8_t* in, size_t len, uint8_t* out) {
    Begin();
    Update(in, out, len);
    EndSeal(out + len);
  }
  // In place: `len` bytes followed by their tag.
  [[nodiscard]] bool Open(uint8_t* record, size_t len) {
    Begin();
    Update(record, record, len);
    return EndOpen(record + len);
  }

 private:
  SessionCipher(std::unique_ptr<GcmEngine> engine, const SessionKeys::Half& keys)
      : engine_(std::move(engine)), base_iv_(keys.iv) {}

  std::unique_ptr<GcmEngine> engine_;
  std::array<uint8_t, 12> base_iv_;
  uint64_t sequence_ = 0;
};

}  // namespace tessera::transport::tcp
