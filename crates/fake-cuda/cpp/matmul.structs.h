// matmul.cu's struct parameters: where their device pointers are (cpp/thunk.h `Pointers`).
#include <cstddef>
template <>
struct fake::Pointers<RopeKv> {
    static constexpr unsigned count = 5;
    static constexpr unsigned offsets[5] = {offsetof(RopeKv, positions), offsetof(RopeKv, inv_freq), offsetof(RopeKv, slots), offsetof(RopeKv, k_cache), offsetof(RopeKv, v_cache)};
};
