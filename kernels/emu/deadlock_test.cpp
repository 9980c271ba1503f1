// deadlock_test.cpp — a kernel whose thread 0 returns before a __syncthreads the others wait
// at. On a GPU that is undefined behaviour (it may hang); the emulator must stop with its
// "deadlock" message instead of hanging the test run. run.sh expects this program to abort
// and checks the message.
#include "cuda_emu.h"

int main() {
    launch(dim3{2}, dim3{64}, [] {
        if (threadIdx.x == 0) return;
        __syncthreads();
    });
    std::printf("no deadlock reported\n");
    return 0;
}
