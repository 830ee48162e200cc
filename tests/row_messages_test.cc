// An embedding table's messages from a hostile peer: each field a decoder
// can check without the shard's state is refused by name, and nothing a
// count claims is allocated before the bytes are there.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "wire/row_messages.h"
#include "wire_raw.h"

namespace tessera::wire {
namespace {

EmbeddingDecl GoodTable() {
  EmbeddingDecl t;
  t.name = "user_id";
  t.dim = 8;
  t.rule = UpdateRule::kAdagrad;
  t.initializer = Initializer::Uniform(-0.1, 0.1, 3);
  t.max_rows_per_shard = 1000;
  return t;
}

Status DecodeDeclared(const EmbeddingDecl& t) {
  // Encoded as is (the encoder does not validate), then decoded as a
  // shard would decode it.
  return Decode<CreateTable>(Encode(CreateTable{1, t}, 1)).status();
}

TEST(RowMessages, ATableDeclarationIsCheckedFieldByField) {
  ASSERT_TRUE(DecodeDeclared(GoodTable()).ok());
  struct Case {
    const char* what;
    std::function<void(EmbeddingDecl&)> spoil;
    const char* needle;
  };
  const Case cases[] = {
      {"empty name", [](EmbeddingDecl& t) { t.name.clear(); }, "table name"},
      {"control character", [](EmbeddingDecl& t) { t.name = "a\nb"; }, "control character"},
      {"dim 0", [](EmbeddingDecl& t) { t.dim = 0; }, "dim 0"},
      {"dim too wide", [](EmbeddingDecl& t) { t.dim = kMaxEmbeddingDim + 1; }, "dim"},
      {"integer rows", [](EmbeddingDecl& t) { t.dtype = DType::kI32; }, "not i32"},
      {"f64 rows", [](EmbeddingDecl& t) { t.dtype = DType::kF64; }, "not f64"},
      {"unknown dtype", [](EmbeddingDecl& t) { t.dtype = static_cast<DType>(99); }, "not"},
      {"unknown rule", [](EmbeddingDecl& t) { t.rule = static_cast<UpdateRule>(77); }, "rule 77"},
      {"ftrl without a learning rate",
       [](EmbeddingDecl& t) {
         t.rule = UpdateRule::kFtrl;
         t.hyper.learning_rate = 0;
       },
       "learning_rate > 0"},
      {"ftrl with weight decay",
       [](EmbeddingDecl& t) {
         t.rule = UpdateRule::kFtrl;
         t.hyper.weight_decay = 0.1f;
       },
       "weight_decay"},
      {"negative l1",
       [](EmbeddingDecl& t) {
         t.rule = UpdateRule::kFtrl;
         t.ftrl.l1 = -1;
       },
       "l1"},
      {"NaN learning rate",
       [](EmbeddingDecl& t) { t.hyper.learning_rate = std::numeric_limits<float>::quiet_NaN(); },
       "learning_rate"},
      {"Glorot", [](EmbeddingDecl& t) { t.initializer = Initializer::GlorotUniform(); }, "Glorot"},
      {"unknown initializer",
       [](EmbeddingDecl& t) { t.initializer.kind = static_cast<Initializer::Kind>(40); },
       "initializer kind 40"},
      {"infinite bound",
       [](EmbeddingDecl& t) { t.initializer.high = std::numeric_limits<double>::infinity(); },
       "finite"},
      {"empty uniform range", [](EmbeddingDecl& t) { t.initializer.low = 0.1; }, "low < high"},
      {"sync without replicas",
       [](EmbeddingDecl& t) {
         t.mode = ConsistencyMode{Consistency::kSync, 0, 0, true, 0};
       },
       "sync mode"},
      {"unknown mode", [](EmbeddingDecl& t) { t.mode.kind = static_cast<Consistency>(9); },
       "consistency mode"},
      {"no rows", [](EmbeddingDecl& t) { t.max_rows_per_shard = 0; }, "max_rows_per_shard"},
  };
  for (const auto& c : cases) {
    EmbeddingDecl t = GoodTable();
    c.spoil(t);
    const Status st = DecodeDeclared(t);
    ASSERT_FALSE(st.ok()) << c.what << " was accepted";
    EXPECT_NE(st.message().find(c.needle), std::string::npos) << c.what << ": " << st.ToString();
  }
}

using test::DecodeRaw;

TEST(RowMessages, TableIdsAreBounded) {
  for (uint32_t id : {0u, kMaxEmbeddingTables + 1, 0xffffffffu}) {
    auto made = Decode<CreateTable>(Encode(CreateTable{id, GoodTable()}, 1));
    ASSERT_FALSE(made.ok()) << "table id " << id;
    EXPECT_NE(made.status().message().find("table id"), std::string::npos);
  }
  EXPECT_TRUE(Decode<CreateTable>(Encode(CreateTable{kMaxEmbeddingTables, GoodTable()}, 1)).ok());
}

TEST(RowMessages, IdCountsAreBoundedByTheFrameAndTheLimit) {
  // A count the bytes cannot hold: refused before anything is allocated.
  auto lying = DecodeRaw<RowsPull>([](MessageWriter& w) {
    w.Put(uint32_t{1});
    w.Put(uint64_t{0});
    w.Put(uint32_t{0});
    w.Put(uint32_t{0xffffffff});
    w.Put(int64_t{5});
  });
  ASSERT_FALSE(lying.ok());
  EXPECT_NE(lying.message().find("id count"), std::string::npos) << lying.ToString();
  // More ids than one message may carry, with every byte present.
  RowsPull many{1, 0, 0, RowIds(kMaxIdsPerMessage + 1, 7)};
  auto over = Decode<RowsPull>(Encode(many, 1));
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.status().message().find("at most 65536"), std::string::npos);
  RowsPull none{1, 0, 0, {}};
  auto empty = Decode<RowsPull>(Encode(none, 1));
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no ids"), std::string::npos);
}

TEST(RowMessages, APushsGradientsMustBeWholeRowsOfItsIds) {
  EXPECT_TRUE(
      Decode<RowsPush>(Encode(RowsPush{1, 2, false, {4, 5}, std::vector<uint8_t>(16)}, 1)).ok());
  auto ragged =
      Decode<RowsPush>(Encode(RowsPush{1, 2, false, {4, 5}, std::vector<uint8_t>(15)}, 1));
  ASSERT_FALSE(ragged.ok());
  EXPECT_NE(ragged.status().message().find("whole number of rows"), std::string::npos);
  auto no_grads = Decode<RowsPush>(Encode(RowsPush{1, 2, false, {4, 5}, {}}, 1));
  ASSERT_FALSE(no_grads.ok());
  EXPECT_NE(no_grads.status().message().find("2 ids with 0 bytes"), std::string::npos);
  // Only an end-of-step marker may be empty.
  EXPECT_TRUE(Decode<RowsPush>(Encode(RowsPush{1, 2, true, {}, {}}, 1)).ok());
  EXPECT_FALSE(Decode<RowsPush>(Encode(RowsPush{1, 2, false, {}, {}}, 1)).ok());
  auto flag = DecodeRaw<RowsPush>([](MessageWriter& w) {
    w.Put(uint32_t{1});
    w.Put(uint64_t{2});
    w.Put(uint8_t{2});
    w.Put(uint32_t{0});
    w.Put(uint32_t{0});
  });
  ASSERT_FALSE(flag.ok());
  EXPECT_NE(flag.message().find("end-of-step"), std::string::npos);
}

TEST(RowMessages, RowBytesAreBoundedPerMessage) {
  // A blob length over the bound is refused from its length field, before
  // its bytes are read or copied.
  auto big = DecodeRaw<RowsPullReply>(
      [](MessageWriter& w) { w.Put(static_cast<uint32_t>(kMaxRowBytesPerMessage + 1)); });
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.message().find("rows"), std::string::npos) << big.ToString();
}

}  // namespace
}  // namespace tessera::wire
