// The client's hot-path building blocks that exist to save allocations: a
// callable kept in place, and the table of requests awaiting answers. Both
// must behave exactly like what they replace (std::function, a map by id).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/pending_requests.h"
#include "core/inline_function.h"
#include "core/pool_allocator.h"
#include "core/ring_queue.h"
#include "core/spares.h"

namespace tessera {
namespace {

using Fn = InlineFunction<int(int), 32>;

TEST(InlineFunction, CallsWhatItHoldsInPlaceOrOnTheHeap) {
  auto shared = std::make_shared<int>(5);
  Fn small = [shared](int x) { return x + *shared; };  // 16 bytes: in place
  std::vector<int> big_capture(3, 7);
  std::string name(100, 'a');
  Fn big = [big_capture, name, shared](int x) {  // larger than 32 bytes: on the heap
    return x + big_capture[0] + static_cast<int>(name.size()) + *shared;
  };
  EXPECT_EQ(small(1), 6);
  EXPECT_EQ(big(1), 113);
  EXPECT_EQ(shared.use_count(), 3);
  Fn copy = big;
  Fn moved = std::move(small);
  EXPECT_FALSE(small);  // NOLINT(bugprone-use-after-move): moved-from is empty, as documented
  EXPECT_EQ(moved(2), 7);
  EXPECT_EQ(copy(0), 112);
  EXPECT_EQ(shared.use_count(), 4);  // moved kept one, big and copy one each
  moved = nullptr;
  copy = std::move(big);
  EXPECT_EQ(shared.use_count(), 2);  // what `copy` held before is gone; big moved into it
  Fn empty;
  EXPECT_THROW(empty(1), std::bad_function_call);
}

TEST(InlineFunction, MutableCallablesKeepTheirState) {
  InlineFunction<int(), 16> counter = [n = 0]() mutable { return ++n; };
  EXPECT_EQ(counter(), 1);
  EXPECT_EQ(counter(), 2);
  auto copy = counter;  // NOLINT(performance-unnecessary-copy-initialization): copying is tested
  EXPECT_EQ(copy(), 3);
  EXPECT_EQ(counter(), 3);
}

TEST(PendingRequests, IdsFindTheirRequestOnceAndNeverAnother) {
  client::PendingRequests<Fn> pending;
  const uint64_t a = pending.Add(0, [](int x) { return x + 1; });
  const uint64_t b = pending.Add(1, [](int x) { return x + 2; });
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  Fn fn;
  int shard = -1;
  ASSERT_TRUE(pending.Take(a, &fn, &shard));
  EXPECT_EQ(fn(0), 1);
  EXPECT_EQ(shard, 0);
  EXPECT_FALSE(pending.Take(a, &fn)) << "answered already";
  // The freed slot is reused under a new id: the old one finds nothing.
  const uint64_t c = pending.Add(0, [](int x) { return x + 3; });
  EXPECT_NE(c, a);
  EXPECT_FALSE(pending.Take(a, &fn));
  EXPECT_FALSE(pending.Take(0, &fn));
  EXPECT_FALSE(pending.Take(~uint64_t{0}, &fn)) << "a forged id";
  EXPECT_EQ(pending.size(), 2u);
  pending.Erase(b);
  EXPECT_FALSE(pending.Take(b, &fn));
  ASSERT_TRUE(pending.Take(c, &fn));
  EXPECT_EQ(fn(0), 3);
  EXPECT_EQ(pending.size(), 0u);
}

TEST(PendingRequests, FailingAShardTakesOnlyItsRequests) {
  client::PendingRequests<Fn> pending;
  std::vector<uint64_t> ids;
  ids.reserve(10);
  for (int i = 0; i < 10; ++i) ids.push_back(pending.Add(i % 2, [i](int) { return i; }));
  std::vector<Fn> failed;
  pending.TakeAllOf(1, &failed);
  ASSERT_EQ(failed.size(), 5u);
  for (const Fn& f : failed) EXPECT_EQ(f(0) % 2, 1);
  for (int i = 0; i < 10; ++i) {
    Fn fn;
    EXPECT_EQ(pending.Take(ids[i], &fn), i % 2 == 0) << i;
  }
  pending.Add(0, [](int) { return 0; });
  pending.Clear();
  EXPECT_EQ(pending.size(), 0u);
}

TEST(PoolAllocator, ReusesFreedBlocksOfTheSameClassFromAnyThread) {
  if (!pool_internal::kPooling) GTEST_SKIP() << "pooling is off under AddressSanitizer";
  PoolAllocator<uint64_t> alloc;
  uint64_t* a = alloc.allocate(20);  // 160 bytes: the 256-byte class
  alloc.deallocate(a, 20);
  uint64_t* b = alloc.allocate(30);  // 240 bytes: the same class, the same block
  EXPECT_EQ(a, b);
  // Freed on another thread, taken again here.
  std::thread([&] { alloc.deallocate(b, 30); }).join();
  EXPECT_EQ(alloc.allocate(17), a);
  alloc.deallocate(a, 17);
  // Larger than any class: the heap's, given back to it.
  uint64_t* big = alloc.allocate(1u << 20);
  big[(1u << 20) - 1] = 1;
  alloc.deallocate(big, 1u << 20);
  std::vector<int, PoolAllocator<int>> v;
  for (int i = 0; i < 10000; ++i) v.push_back(i);  // grows through every class and past them
  EXPECT_EQ(v[9999], 9999);
}

// A FIFO through which a frame passes per call: in order across wrap-around
// and growth, push_front ahead of everything, every element destroyed once,
// and no growth at all while what it holds stays bounded.
TEST(RingQueue, KeepsOrderAndItsStorage) {
  auto live = std::make_shared<int>(0);
  struct Tracked {
    std::shared_ptr<int> live;
    int value;
    Tracked(std::shared_ptr<int> l, int v) : live(std::move(l)), value(v) { ++*live; }
    Tracked(Tracked&& o) noexcept : live(o.live), value(o.value) { ++*live; }
    ~Tracked() { --*live; }
  };
  RingQueue<Tracked> q;
  int next_in = 0, next_out = 0;
  // Grow to 12 (capacity 16), then cycle many times through the wrap.
  for (; next_in < 12; ++next_in) q.push_back({live, next_in});
  const size_t capacity = q.capacity();
  EXPECT_EQ(capacity, 16u);
  for (int round = 0; round < 1000; ++round) {
    q.push_back({live, next_in++});
    ASSERT_EQ(q.front().value, next_out++);
    q.pop_front();
  }
  EXPECT_EQ(q.capacity(), capacity) << "a bounded queue grew";
  EXPECT_EQ(*live, 12);
  // Growth while wrapped keeps the order; push_front goes first.
  for (int i = 0; i < 30; ++i) q.push_back({live, next_in++});
  q.push_front({live, -1});
  EXPECT_EQ(q.size(), 43u);
  EXPECT_EQ(q.front().value, -1);
  q.pop_front();
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i].value, next_out + static_cast<int>(i));
  RingQueue<Tracked> moved = std::move(q);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(moved.front().value, next_out);
  EXPECT_EQ(*live, 42);
  moved.clear();
  EXPECT_EQ(*live, 0);
  // A drained queue keeps its storage up to a bound, and gives back more.
  moved.ReleaseIfEmptyAbove(64);
  EXPECT_EQ(moved.capacity(), 64u);
  moved.ReleaseIfEmptyAbove(16);
  EXPECT_EQ(moved.capacity(), 0u);
  moved.push_back({live, 1});
  moved.ReleaseIfEmptyAbove(0);
  EXPECT_EQ(moved.capacity(), 8u) << "a queue that holds something keeps its storage";
  EXPECT_EQ(moved.front().value, 1);
}

// Messages handed back after use come out again with their capacity, the
// last given first; beyond the bound one handed back is dropped, and with
// none kept a new one is made.
TEST(Spares, HandsBackWhatWasGivenWithItsCapacity) {
  Spares<std::vector<int>> spares;
  EXPECT_TRUE(spares.Take().empty()) << "none kept: a new one";
  std::vector<int> a;
  a.reserve(1000);
  const int* storage = nullptr;
  a.push_back(7);
  storage = a.data();
  spares.Give(std::move(a));
  std::vector<int> again = spares.Take();
  EXPECT_EQ(again.data(), storage) << "the same storage came back";
  EXPECT_GE(again.capacity(), 1000u);
  EXPECT_EQ(spares.size(), 0u);
  for (size_t i = 0; i < Spares<std::vector<int>>::kKept + 5; ++i) {
    spares.Give(std::vector<int>(1, static_cast<int>(i)));
  }
  EXPECT_EQ(spares.size(), Spares<std::vector<int>>::kKept) << "bounded";
  EXPECT_EQ(spares.Take().front(), static_cast<int>(Spares<std::vector<int>>::kKept - 1));
}

}  // namespace
}  // namespace tessera
