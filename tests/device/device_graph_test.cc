// The device graph (DeviceDecoderModel) on the host device against the CPU engine's
// DecoderModel: both call the same CPU kernels in the same order, so every logit of every step
// and the captured residual stream must be bit-identical -- for mixed prefill / decode batches,
// logits of every token and of the last only, a copy-on-write block and both KV cache types.
// Any op the graph forgets, reorders or feeds the wrong rows shows up here without a GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "device_test_util.h"
#include "kernels/ops.h"

namespace peng {
namespace {

using device_test::Load;
using device_test::ModelPaths;
using device_test::RunCpu;
using device_test::RunDevice;

class DeviceGraphTest : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceGraphTest, HostDeviceEqualsCpuPathBitForBit) {
  ThreadPool pool(2);
  auto device = backend::CreateDevice("host", &pool);
  ASSERT_TRUE(device.ok());
  for (const std::string& path : ModelPaths()) {
    SCOPED_TRACE(path);
    std::unique_ptr<Model> model = Load(path);
    ASSERT_NE(model, nullptr);
    const device_test::Run cpu = RunCpu(*model, GetParam(), &pool);
    const device_test::Run dev = RunDevice(*model, device->get(), GetParam());
    ASSERT_EQ(cpu.logits.size(), dev.logits.size());
    for (size_t i = 0; i < cpu.logits.size(); ++i) {
      ASSERT_EQ(cpu.logits[i].size(), dev.logits[i].size()) << "step " << i;
      ASSERT_FALSE(cpu.logits[i].empty());
      for (size_t j = 0; j < cpu.logits[i].size(); ++j)
        ASSERT_EQ(cpu.logits[i][j], dev.logits[i][j]) << "step " << i << " logit " << j;
    }
    ASSERT_EQ(cpu.hidden.size(), dev.hidden.size());
    for (size_t j = 0; j < cpu.hidden.size(); ++j) ASSERT_EQ(cpu.hidden[j], dev.hidden[j]) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, DeviceGraphTest, ::testing::Values(DType::kF16, DType::kF32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// DeepSeek-V2: the device graph runs MLA absorbed for every step (the CPU picks the expanded
// form for some prefills) and sums the routed experts per token in slot order, so the results
// differ by rounding only: within 1e-5 of the largest |logit|, in exact mode and F32 KV.
TEST(DeviceGraph, DeepseekOnTheHostDeviceMatchesTheCpuPath) {
  kernels::SetExactActivations(true);
  ThreadPool pool(2);
  auto device = backend::CreateDevice("host", &pool);
  ASSERT_TRUE(device.ok());
  for (const std::string& path : device_test::DeepseekPaths()) {
    SCOPED_TRACE(path);
    std::unique_ptr<Model> model = Load(path);
    ASSERT_NE(model, nullptr);
    const device_test::Run cpu = RunCpu(*model, DType::kF32, &pool);
    const device_test::Run dev = RunDevice(*model, device->get(), DType::kF32);
    const double d = device_test::RelativeDistance(cpu.logits, dev.logits);
    std::printf("[device] %s: max |dlogit| / max |logit| = %.2e\n", path.c_str(), d);
    EXPECT_LE(d, 1e-5);
    EXPECT_GT(cpu.logits.size(), 0u);
  }
  kernels::SetExactActivations(false);
}

TEST(DeviceGraph, ExactModeToo) {
  kernels::SetExactActivations(true);
  ThreadPool pool(2);
  auto device = backend::CreateDevice("host", &pool);
  ASSERT_TRUE(device.ok());
  std::unique_ptr<Model> model = Load(ModelPaths()[1]);  // qwen2 tiny
  const device_test::Run cpu = RunCpu(*model, DType::kF32, &pool);
  const device_test::Run dev = RunDevice(*model, device->get(), DType::kF32);
  kernels::SetExactActivations(false);
  ASSERT_EQ(cpu.logits, dev.logits);
}

TEST(DeviceSpec, ParsesAndRefuses) {
  EXPECT_EQ(*backend::ParseDeviceSpec("host"), -1);
  EXPECT_EQ(*backend::ParseDeviceSpec("cuda"), 0);
  EXPECT_EQ(*backend::ParseDeviceSpec("cuda:3"), 3);
  for (const char* bad : {"cuda:", "cuda:x", "cuda:-1", "gpu", "cuda:1x", "cuda:99999999", ""}) {
    StatusOr<int> r = backend::ParseDeviceSpec(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("unknown device"), std::string::npos) << bad;
  }
}

TEST(DeviceSpec, CudaWithoutAGpuIsAClearError) {
  if (backend::CudaDeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  ThreadPool pool(1);
  auto d = backend::CreateDevice("cuda", &pool);
  ASSERT_FALSE(d.ok());
#ifdef PENG_HAVE_CUDA
  EXPECT_NE(d.status().message().find("no CUDA device"), std::string::npos) << d.status().ToString();
#else
  EXPECT_NE(d.status().message().find("built without the CUDA backend"), std::string::npos);
#endif
}

}  // namespace
}  // namespace peng
