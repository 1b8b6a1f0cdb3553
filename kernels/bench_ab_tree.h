// One kernel tree (the kern_impl.h named by FD_TREE_IMPL) instantiated in namespace fdk::FD_TREE_NS, at the
// AVX-512 (w16) and AVX2 (w8) widths under the same target pragmas as csrc/kernels.cc. The A/B harnesses
// include it once per tree; deliberately without an include guard.
namespace fdk {
namespace FD_TREE_NS {
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,bmi2")
namespace w16 {
#define FD_W 16
#define FD_MR 12
#include FD_TREE_IMPL
#undef FD_W
#undef FD_MR
}  // namespace w16
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace w8 {
#define FD_W 8
#define FD_MR 2
#include FD_TREE_IMPL
#undef FD_W
#undef FD_MR
}  // namespace w8
#pragma GCC pop_options
}  // namespace FD_TREE_NS
}  // namespace fdk
