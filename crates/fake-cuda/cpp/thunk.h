// thunk.h — what the fake driver needs of each kernel compiled for the host: its name, its
// parameter list as the C++ signature declares it (one letter a parameter), and a function
// that unpacks cuLaunchKernel's `kernelParams` by that signature and runs the kernel on the
// emulator (kernels/emu/cuda_emu.h). Included after a kernel file; build.rs writes the table.
#pragma once
#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace fake {
// p: pointer (PTX .u64), i: 32-bit integer (.u32/.s32/.b32), l: 64-bit integer (.u64/...),
// f: float (.f32), s: a struct passed by value (.b8 array of its size). The driver holds these
// against the PTX `.param` list.
template <typename T>
constexpr char code() {
    if constexpr (std::is_pointer_v<T>) return 'p';
    else if constexpr (std::is_same_v<T, float>) return 'f';
    else if constexpr (std::is_integral_v<T> && sizeof(T) == 4) return 'i';
    else if constexpr (std::is_integral_v<T> && sizeof(T) == 8) return 'l';
    else if constexpr (std::is_class_v<T> && std::is_trivially_copyable_v<T>) return 's';
    else static_assert(sizeof(T) == 0, "a kernel parameter type the fake driver does not unpack");
}

// The byte offsets of the device pointers inside a struct passed by value, which the driver
// checks like pointer parameters: specialized in cpp/<file>.structs.h beside the struct's
// kernel file (a struct without one is checked for nothing).
template <typename T>
struct Pointers {
    static constexpr unsigned count = 0;
    static constexpr unsigned offsets[1] = {0};
};

struct Launch {
    unsigned grid[3];
    unsigned block[3];
    unsigned smem;
    unsigned long long block_order_seed;
    void* const* params;  // one pointer a parameter, to its bytes
    // Programmatic dependent launch (cuda_emu.h `Pdl`): when `pdl_primary` is set, this grid is
    // the dependent and pdl_primary(pdl_arg) runs its primary from inside it, at the first
    // block's PDL_WAIT (`pdl_late`: after the first block). Out: whether the primary had to run
    // without any thread waiting for it, and this grid's PDL_WAIT calls.
    void (*pdl_primary)(void*);
    void* pdl_arg;
    unsigned pdl_late;
    unsigned* pdl_ran_late;
    unsigned long long* pdl_waits;
};

struct Kernel {
    const char* name;
    const char* sig;         // one letter a parameter (above)
    const unsigned* sizes;   // bytes of each parameter
    const unsigned* ptrs;    // (parameter, byte offset) of each device pointer to check
    unsigned nptrs;
    void (*run)(const Launch*);
};

template <typename T>
constexpr unsigned pointers_in() {
    if constexpr (std::is_pointer_v<T>) return 1;
    else if constexpr (std::is_class_v<T>) return Pointers<T>::count;
    else return 0;
}

template <typename T, std::size_t N>
constexpr void add_pointers(std::array<unsigned, N>& a, unsigned& k, unsigned i) {
    if constexpr (std::is_pointer_v<T>) {
        a[k++] = i;
        a[k++] = 0;
    } else if constexpr (std::is_class_v<T>) {
        for (unsigned j = 0; j < Pointers<T>::count; ++j) {
            a[k++] = i;
            a[k++] = Pointers<T>::offsets[j];
        }
    }
}

template <typename... A>
struct Desc {
    static constexpr char sig[] = {code<A>()..., '\0'};
    static constexpr unsigned sizes[] = {(unsigned)sizeof(A)..., 0u};
    static constexpr unsigned nptrs = (pointers_in<A>() + ... + 0u);
    static constexpr std::array<unsigned, 2 * nptrs + 2> ptrs = [] {
        std::array<unsigned, 2 * nptrs + 2> a{};
        unsigned k = 0, i = 0;
        (add_pointers<A>(a, k, i++), ...);
        return a;
    }();
};

template <typename... A, std::size_t... I>
void run_impl(void (*f)(A...), const Launch& l, std::index_sequence<I...>) {
    // Copied out before the blocks run: a kernel sees its arguments by value, as on a GPU.
    std::tuple<A...> args{*static_cast<const A*>(l.params[I])...};
    emu::block_order_seed = l.block_order_seed;
    emu::pdl.primary = l.pdl_primary;
    emu::pdl.arg = l.pdl_arg;
    emu::pdl.late = l.pdl_late != 0;
    emu::pdl.ran_late = false;
    const unsigned long long waits = emu::pdl.waits;
    launch(dim3{l.grid[0], l.grid[1], l.grid[2]}, dim3{l.block[0], l.block[1], l.block[2]}, [&] { std::apply(f, args); }, l.smem);
    if (l.pdl_ran_late) *l.pdl_ran_late = emu::pdl.ran_late;
    if (l.pdl_waits) *l.pdl_waits = emu::pdl.waits - waits;
    emu::pdl = emu::Pdl{nullptr, nullptr, false, false, emu::pdl.waits, emu::pdl.triggers};
    emu::block_order_seed = 0;
}

template <typename... A>
void run_with(void (*f)(A...), const Launch& l) {
    run_impl(f, l, std::index_sequence_for<A...>{});
}

template <auto F>
void run(const Launch* l) {
    run_with(F, *l);
}

template <typename... A>
constexpr Kernel describe(const char* name, void (*)(A...), void (*r)(const Launch*)) {
    using D = Desc<std::remove_cv_t<A>...>;
    return Kernel{name, D::sig, D::sizes, D::ptrs.data(), D::nptrs, r};
}
}  // namespace fake
