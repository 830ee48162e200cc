// The frames of Tessera's tcp backend. A connection starts with an 8-byte
// preamble each way ("TSRATCP" and a version byte), then carries frames: a
// 48-byte little-endian header and `length` payload bytes.
//
//   u8 type | u8 reserved | u16 msg_id | u32 region | u64 op | u64 addr | u64 length | u8 key[16]
//
// kMessage   msg_id, length: a message for the handler of msg_id
// kPut       region, key, addr, length, op: write the payload at addr
// kPutDone   op: the put's bytes are in the target's memory
// kGet       region, key, addr, length, op: no payload; answered by kGetData
// kGetData   op, length: the bytes a get asked for
//
// The target checks every field before it touches memory: the region and its
// key (compared in constant time), the access the region allows, that
// [addr, addr+length) lies inside it, and that the peer authenticated. A
// frame that fails any check closes the connection: a correct peer never
// sends one. There are no error replies to one-sided operations.
//
// A protected session (Endpoint::ProtectSession) sends a message as one
// AEAD record (header, body, tag), any other frame's header as a record
// (48 bytes and a tag) and its non-empty payload as another
// (tcp_session_cipher.h).
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "tessera/status.h"

namespace tessera::transport::tcp {

constexpr std::array<uint8_t, 8> kPreamble = {'T', 'S', 'R', 'A', 'T', 'C', 'P', 1};
constexpr size_t kFrameHeaderBytes = 48;
using RegionKey = std::array<uint8_t, 16>;

enum class FrameType : uint8_t { kMessage = 1, kPut = 2, kPutDone = 3, kGet = 4, kGetData = 5 };

struct FrameHeader {
  FrameType type = FrameType::kMessage;
  uint16_t msg_id = 0;
  uint32_t region = 0;
  uint64_t op = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  RegionKey key{};
};

void EncodeFrameHeader(const FrameHeader& h, std::span<uint8_t, kFrameHeaderBytes> out);
// Checks the type and the reserved byte; lengths are the receiver's to check.
Result<FrameHeader> DecodeFrameHeader(std::span<const uint8_t, kFrameHeaderBytes> in);

}  // namespace tessera::transport::tcp
