// Paddle glue of the fused sampler: checks every shape and offset, so the kernel never reads outside its
// inputs. The sampler works on the host: inputs arrive as zero-copy views of numpy arrays.

#include <vector>

#include "paddle/extension.h"
#include "sampler.h"

namespace {

using paddle::DataType;
using paddle::Tensor;

void check(const Tensor& x, DataType dt, size_t ndim, const char* name) {
  PD_CHECK(x.is_cpu(), "sample: ", name, " must be a CPU tensor");
  PD_CHECK(x.dtype() == dt, "sample: ", name, " has the wrong dtype");
  PD_CHECK(x.shape().size() == ndim && x.is_contiguous(), "sample: ", name, " must be a contiguous ",
           ndim, "-D tensor");
}

}  // namespace

std::vector<Tensor> Sample(const Tensor& logits, const Tensor& params, const Tensor& ids, const Tensor& meta,
                           const Tensor& uniforms, bool rejection) {
  check(logits, DataType::FLOAT32, 2, "logits");
  check(params, DataType::FLOAT64, 2, "params");
  check(ids, DataType::INT64, 1, "ids");
  check(meta, DataType::INT64, 2, "meta");
  check(uniforms, DataType::FLOAT64, 2, "uniforms");
  const int64_t rows = logits.shape()[0], vocab = logits.shape()[1], nu = uniforms.shape()[1];
  PD_CHECK(vocab > 0, "sample: empty vocabulary");
  PD_CHECK(params.shape()[0] == rows && params.shape()[1] == fdk::kNumSampleParams,
           "sample: params must be [rows, ", (int)fdk::kNumSampleParams, "]");
  PD_CHECK(meta.shape()[0] == rows && meta.shape()[1] == fdk::kNumSampleMeta,
           "sample: meta must be [rows, ", (int)fdk::kNumSampleMeta, "]");
  PD_CHECK(uniforms.shape()[0] == rows && nu >= 1, "sample: uniforms must be [rows, >= 1]");
  const int64_t* m = meta.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* mr = m + r * fdk::kNumSampleMeta;
    const int64_t len = mr[fdk::kNumPrompt] + mr[fdk::kNumOutput] + mr[fdk::kNumBanned];
    PD_CHECK(mr[fdk::kOffset] >= 0 && mr[fdk::kNumPrompt] >= 0 && mr[fdk::kNumOutput] >= 0 &&
                 mr[fdk::kNumBanned] >= 0 && mr[fdk::kOffset] + len <= ids.numel(),
             "sample: row ", r, " has ids outside the ids tensor");
  }
  Tensor out = paddle::empty({rows}, DataType::INT64, logits.place());
  fdk::SampleArgs a{logits.data<float>(), rows,  vocab, params.data<double>(), ids.data<int64_t>(), m,
                    uniforms.data<double>(), nu,   rejection, out.data<int64_t>()};
  if (rows) fdk::sample(a);
  return {out};
}

PD_BUILD_OP(fd_sample)
    .Inputs({"Logits", "Params", "Ids", "Meta", "Uniforms"})
    .Outputs({"Out"})
    .Attrs({"rejection: bool"})
    .SetKernelFn(PD_KERNEL(Sample));
