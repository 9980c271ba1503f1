// matmul_sm90.cu's struct parameters: a tensor map's global address (kernels/emu/wgmma.h
// `TensorMap2d::base`, 8 bytes in) is checked like a pointer parameter (cpp/thunk.h `Pointers`);
// RopeKv as matmul.cu's (the wgmma kernel takes matmul.cu's epilogue arguments).
#include "matmul.structs.h"
template <>
struct fake::Pointers<TmaMap> {
    static constexpr unsigned count = 1;
    static constexpr unsigned offsets[1] = {8};
};
