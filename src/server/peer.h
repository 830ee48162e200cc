// A connection to a server and what the server knows of it: its handshake,
// what it authenticated as, and, for a worker of a shard, its staging slot.
// Owned by PeerSessions; the roles' handlers keep pointers to it while they
// serve its requests and forget them when it goes. Progress thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "server/param_memory.h"
#include "transport/transport.h"
#include "wire/handshake.h"

namespace tessera::server {

using EndpointPtr = std::shared_ptr<transport::Endpoint>;

struct Peer {
  Peer(EndpointPtr endpoint, const std::string& secret, const std::string& reader_key)
      : ep(std::move(endpoint)), handshake(secret, reader_key) {}
  EndpointPtr ep;
  bool authenticated = false;
  wire::ServerHandshake handshake;
  wire::Hello hello;  // the peer's, once it authenticated
  std::unique_ptr<transport::Region> staging;
  // A worker on this node of a GPU shard maps the arenas and a GPU slot of
  // the staging slot's size with CUDA IPC. ipc_slot: that slot, set only
  // for such a worker (the staging region itself where the fabric reaches
  // GPU memory, else ipc_slot_owner).
  uint8_t* ipc_slot = nullptr;
  StateBuffer ipc_slot_owner;
  std::set<uint32_t> known_arenas;
  bool is_shard = false;     // a ps task's link to this coordinator
  bool is_observer = false;  // `tessera status`: asks for status, nothing else
  // A read-only client (it proved the reader key): looks tensors up and
  // pulls them; no staging slot, no worker rank, never writes.
  bool is_reader = false;
  bool said_bye = false;  // leaves on purpose: its disconnect is no loss
};

}  // namespace tessera::server
