// The safetensors reader: round trips of dtypes and shapes, every malformed-file case with the
// file and field named, and sharded checkpoints through model.safetensors.index.json.
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "engine/safetensors.h"
#include "safetensors_writer.h"

namespace graphdecode {
namespace {

using testing::SafetensorsWriter;
using testing::TempDir;
using testing::write_raw;
using testing::write_text;

template <typename T>
std::vector<T> read_as(const TensorInfo& t) {
  std::vector<T> v(t.data.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

TEST(Safetensors, RoundTripDtypesShapesAndMetadata) {
  TempDir dir;
  SafetensorsWriter w;
  const std::vector<std::uint16_t> bf = {0x3f80, 0xbf80, 0x0000, 0x7f80, 0x4000, 0x1234};
  const std::vector<std::uint16_t> h = {0x3c00, 0xc000, 0x7bff};
  const std::vector<float> f = {1.5f, -2.25f, 3.0f, 0.0f};
  w.add_bf16("a.weight", {2, 3}, bf);
  w.add_f16("b.weight", {3}, h);
  w.add_f32("c.weight", {2, 1, 2}, f);
  w.add_f32("scalar", {}, {7.0f});
  w.add_raw("empty", "BF16", {0, 5}, nullptr, 0);
  w.set_metadata("format", "pt");
  w.write(dir.file("m.safetensors"));

  const SafetensorsFile file(dir.file("m.safetensors"));
  EXPECT_EQ(file.path(), dir.file("m.safetensors"));
  EXPECT_EQ(file.tensors().size(), 5u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  const TensorInfo* a = file.find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, TensorDType::kBF16);
  EXPECT_EQ(a->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a->numel(), 6);
  EXPECT_EQ(read_as<std::uint16_t>(*a), bf);
  EXPECT_EQ(file.find("b.weight")->dtype, TensorDType::kF16);
  EXPECT_EQ(read_as<std::uint16_t>(*file.find("b.weight")), h);
  EXPECT_EQ(file.find("c.weight")->dtype, TensorDType::kF32);
  EXPECT_EQ(read_as<float>(*file.find("c.weight")), f);
  EXPECT_EQ(file.find("scalar")->numel(), 1);
  EXPECT_EQ(read_as<float>(*file.find("scalar")), std::vector<float>{7.0f});
  EXPECT_EQ(file.find("empty")->numel(), 0);
  EXPECT_TRUE(file.find("empty")->data.empty());
  EXPECT_EQ(file.find("nope"), nullptr);

  // Moving keeps the mapping (and spans) valid.
  SafetensorsFile moved = SafetensorsFile(dir.file("m.safetensors"));
  SafetensorsFile other(std::move(moved));
  EXPECT_EQ(read_as<float>(*other.find("c.weight")), f);

  const auto ckpt = SafetensorsCheckpoint::open_file(dir.file("m.safetensors"));
  EXPECT_EQ(ckpt.names().size(), 5u);
  EXPECT_EQ(ckpt.file_of("a.weight"), dir.file("m.safetensors"));
  EXPECT_EQ(shape_to_string(ckpt.find("c.weight")->shape), "[2, 1, 2]");
}

// Writes `header` and `data` raw and expects an Error naming the file and `field`.
void expect_malformed(const std::string& header, std::vector<std::uint8_t> data,
                      const std::string& field, std::uint64_t header_len = ~0ull) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_raw(path, header, data, header_len);
  try {
    SafetensorsFile f(path);
    ADD_FAILURE() << "no error for " << header;
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), path) << e.what();
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
}

TEST(Safetensors, MalformedFilesNameTheField) {
  const std::vector<std::uint8_t> four(4, 0), eight(8, 0);
  const auto t = [](const std::string& body) { return "{\"t\":" + body + "}"; };
  // Header length past the end of the file, and a file too short to hold one.
  expect_malformed("{}", {}, "header_length", 1000);
  {
    TempDir dir;
    write_text(dir.file("short"), "abc");
    try {
      SafetensorsFile f(dir.file("short"));
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_EQ(e.field(), "header_length");
      EXPECT_EQ(e.where(), dir.file("short"));
    }
  }
  expect_malformed("{\"t\": {", {}, "header");
  expect_malformed("[1, 2]", {}, "header");
  expect_malformed(t(R"("x")"), {}, "t");
  expect_malformed(t(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})"), eight, "t.dtype");
  expect_malformed(t(R"({"dtype":"I8","shape":[4],"data_offsets":[0,4]})"), four, "t.dtype");
  expect_malformed(t(R"({"shape":[2],"data_offsets":[0,4]})"), four, "t.dtype");
  expect_malformed(t(R"({"dtype":"BF16","data_offsets":[0,4]})"), four, "t.shape");
  expect_malformed(t(R"({"dtype":"BF16","shape":[-2],"data_offsets":[0,4]})"), four, "t.shape");
  expect_malformed(t(R"({"dtype":"BF16","shape":[2.5],"data_offsets":[0,4]})"), four, "t.shape");
  expect_malformed(t(R"({"dtype":"BF16","shape":[2]})"), four, "t.data_offsets");
  expect_malformed(t(R"({"dtype":"BF16","shape":[2],"data_offsets":[0]})"), four, "t.data_offsets");
  expect_malformed(t(R"({"dtype":"BF16","shape":[4],"data_offsets":[0,8]})"), four,
                   "t.data_offsets");  // past the end of the data
  expect_malformed(t(R"({"dtype":"BF16","shape":[0],"data_offsets":[4,2]})"), four,
                   "t.data_offsets");  // begin > end
  expect_malformed(t(R"({"dtype":"BF16","shape":[3],"data_offsets":[0,4]})"), four,
                   "t.shape");  // 3 x 2 bytes != 4
  expect_malformed(t(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"), eight,
                   "t.shape");  // 2 x 4 bytes != 4
  expect_malformed(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},
                       "b":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})",
                   eight, "b.data_offsets");  // overlap
  expect_malformed(R"({"__metadata__":{"k":3}})", {}, "__metadata__.k");
  expect_malformed(R"({"__metadata__":[1]})", {}, "__metadata__");
}

TEST(Safetensors, MissingFile) {
  try {
    SafetensorsFile f("/nonexistent/x.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "/nonexistent/x.safetensors");
    EXPECT_EQ(e.field(), "path");
  }
}

// Two shards and an index; each shard holds its own tensors.
void write_shards(const TempDir& dir) {
  SafetensorsWriter s1, s2;
  s1.add_f32("x", {2}, {1.0f, 2.0f});
  s1.add_f32("y", {1}, {3.0f});
  s2.add_f32("z", {3}, {4.0f, 5.0f, 6.0f});
  s1.write(dir.file("model-00001-of-00002.safetensors"));
  s2.write(dir.file("model-00002-of-00002.safetensors"));
}
const char* kIndex = R"({"metadata": {"total_size": 24}, "weight_map": {
  "x": "model-00001-of-00002.safetensors", "y": "model-00001-of-00002.safetensors",
  "z": "model-00002-of-00002.safetensors"}})";

TEST(Safetensors, ShardedCheckpointThroughIndex) {
  TempDir dir;
  write_shards(dir);
  write_text(dir.file("model.safetensors.index.json"), kIndex);
  auto c = SafetensorsCheckpoint::open_dir(dir.path());
  EXPECT_EQ(c.num_files(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"x", "y", "z"}));
  EXPECT_EQ(read_as<float>(*c.find("z")), (std::vector<float>{4.0f, 5.0f, 6.0f}));
  EXPECT_EQ(c.file_of("y"), dir.file("model-00001-of-00002.safetensors"));
  EXPECT_EQ(c.source(), dir.file("model.safetensors.index.json"));
  // The checkpoint moves without invalidating its tensors.
  SafetensorsCheckpoint moved = std::move(c);
  EXPECT_EQ(read_as<float>(*moved.find("x")), (std::vector<float>{1.0f, 2.0f}));
}

void expect_bad_index(const std::string& index, const std::string& field) {
  TempDir dir;
  write_shards(dir);
  write_text(dir.file("model.safetensors.index.json"), index);
  try {
    SafetensorsCheckpoint::open_dir(dir.path());
    ADD_FAILURE() << "no error for " << index;
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

TEST(Safetensors, BadIndexes) {
  // The index names the wrong shard for z.
  expect_bad_index(R"({"weight_map": {"x": "model-00001-of-00002.safetensors",
      "y": "model-00001-of-00002.safetensors", "z": "model-00001-of-00002.safetensors"}})",
                   "weight_map.z");
  // Shard 1 holds y, which the index does not list.
  expect_bad_index(R"({"weight_map": {"x": "model-00001-of-00002.safetensors",
      "z": "model-00002-of-00002.safetensors"}})",
                   "y");
  // A shard that does not exist.
  expect_bad_index(R"({"weight_map": {"x": "model-00009.safetensors"}})", "path");
  expect_bad_index(R"({"weight_map": {"x": "../elsewhere.safetensors"}})", "weight_map.x");
  expect_bad_index(R"({"metadata": {}})", "weight_map");
  expect_bad_index(R"({"weight_map": )", "json");
}

TEST(Safetensors, DirectoryWithoutCheckpoint) {
  TempDir dir;
  try {
    SafetensorsCheckpoint::open_dir(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.field(), "path");
  }
}

}  // namespace
}  // namespace graphdecode
