// The shard's pull leases, without a socket: who may release what, what a
// disconnect and the timeout end, and how many one connection may hold.
#include <gtest/gtest.h>

#include "server/lease_table.h"

namespace tessera::server {
namespace {

using Clock = LeaseTable::Clock;
using namespace std::chrono_literals;

int a_owner, b_owner;  // stand-ins for two connections
const void* const kA = &a_owner;
const void* const kB = &b_owner;

LeaseTable::Lease Of(const void* owner, std::vector<uint32_t> keys, Clock::time_point expires) {
  return {owner, owner == kA ? "/job:worker/task:0" : "/job:worker/task:1",
          LeaseTable::Keys(keys.begin(), keys.end()), expires};
}

TEST(LeaseTable, OnlyItsHolderReleasesALease) {
  LeaseTable table;
  const auto later = Clock::now() + 1h;
  auto id = table.Grant(Of(kA, {1, 2}, later));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(table.Release(*id, kB).status().code(), StatusCode::kNotFound);
  auto lease = table.Release(*id, kA);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->keys, (LeaseTable::Keys{1, 2}));
  EXPECT_FALSE(table.Release(*id, kA).ok()) << "released twice";
  EXPECT_EQ(table.size(), 0u);
}

TEST(LeaseTable, ADisconnectEndsItsLeasesOnly) {
  LeaseTable table;
  const auto later = Clock::now() + 1h;
  ASSERT_TRUE(table.Grant(Of(kA, {1}, later)).ok());
  ASSERT_TRUE(table.Grant(Of(kA, {2}, later)).ok());
  auto kept = table.Grant(Of(kB, {1}, later));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(table.ReleaseAllOf(kA).size(), 2u);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(table.Release(*kept, kB).ok());
}

TEST(LeaseTable, ExpiredLeasesAreTakenOnce) {
  LeaseTable table;
  const auto now = Clock::now();
  auto old = table.Grant(Of(kA, {7}, now - 1ms));
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE(table.Grant(Of(kB, {8}, now + 1h)).ok());
  auto expired = table.TakeExpired(now);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, *old);
  EXPECT_EQ(expired[0].lease.keys, LeaseTable::Keys{7});
  EXPECT_TRUE(table.TakeExpired(now).empty());
  EXPECT_FALSE(table.Release(*old, kA).ok()) << "a revoked lease is gone";
}

// Every lease pins chunks against updates: one connection cannot make the
// shard hold without bound. Releasing makes room again.
TEST(LeaseTable, OneConnectionHoldsABoundedNumber) {
  LeaseTable table(3);
  const auto later = Clock::now() + 1h;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(table.Grant(Of(kA, {1}, later)).value());
  auto refused = table.Grant(Of(kA, {1}, later));
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("/job:worker/task:0 holds 3 pull leases"),
            std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(table.Grant(Of(kB, {1}, later)).ok()) << "another connection is not affected";
  ASSERT_TRUE(table.Release(ids[0], kA).ok());
  EXPECT_TRUE(table.Grant(Of(kA, {1}, later)).ok());
  EXPECT_EQ(table.TakeExpired(later + 1s).size(), 4u);
  EXPECT_TRUE(table.Grant(Of(kA, {1}, later)).ok()) << "expiry makes room too";
}

}  // namespace
}  // namespace tessera::server
