// AES-256-GCM one record at a time, in pieces, from one crypto library.
// Every engine produces the same bytes and tags (tests/transport_test.cc
// seals with one and opens with the other), so peers need not agree on
// which they run. Intel's IPsec-MB is used where it was built in and the
// CPU has AES-NI: its VAES/AVX-512 code seals about three times as fast as
// OpenSSL 3.0's, which bounds a protected session's bandwidth
// (docs/PERFORMANCE.md); OpenSSL everywhere else.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tessera/status.h"

namespace tessera::transport::tcp {

constexpr size_t kGcmTagBytes = 16;

enum class GcmLibrary : uint8_t {
  kFastest,  // IPsec-MB where it can run here, else OpenSSL
  kOpenSsl,
  kIpsecMb,
};

struct GcmOptions {
  GcmLibrary library = GcmLibrary::kFastest;
  bool seal = true;  // false: open (decrypt and check)
  // false: the bytes are GCM's associated data only (GMAC) and travel as
  // they are.
  bool encrypt = true;
};

class GcmEngine {
 public:
  // Unimplemented where `library` asks for IPsec-MB and this build or CPU
  // has none.
  static Result<std::unique_ptr<GcmEngine>> Create(const std::array<uint8_t, 32>& key,
                                                   const GcmOptions& options);
  // Whether GcmLibrary::kIpsecMb can run here (built in, and the CPU has
  // the instructions it needs).
  static bool IpsecMbRunsHere();

  virtual ~GcmEngine() = default;
  // A record: Start with its nonce, Update each piece (out may equal in),
  // then EndSeal writes the tag or EndOpen checks it.
  virtual void Start(const std::array<uint8_t, 12>& iv) = 0;
  virtual void Update(const uint8_t* in, uint8_t* out, size_t len) = 0;
  virtual void EndSeal(uint8_t tag[kGcmTagBytes]) = 0;
  [[nodiscard]] virtual bool EndOpen(const uint8_t tag[kGcmTagBytes]) = 0;
  // "OpenSSL 3.0.x" or "IPsec-MB 1.3.0 (AVX-512)": what doctor reports.
  virtual std::string library_name() const = 0;
};

// The constructors behind Create; each in its own file.
Result<std::unique_ptr<GcmEngine>> CreateOpenSslGcm(const std::array<uint8_t, 32>& key,
                                                    const GcmOptions& options);
Result<std::unique_ptr<GcmEngine>> CreateIpsecMbGcm(const std::array<uint8_t, 32>& key,
                                                    const GcmOptions& options);

}  // namespace tessera::transport::tcp
