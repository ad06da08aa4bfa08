// A plain reference for host<->device bandwidth: cudaMemcpyAsync of pinned memory, CUDA events,
// median of 9 after 2 warm-ups, GB = 1e9 bytes. Prints one JSON line.
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

static double median_gbps(size_t bytes, std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return bytes / (ms[ms.size() / 2] / 1e3) / 1e9;
}

int main(int argc, char** argv) {
  int dev = argc > 1 ? atoi(argv[1]) : 0;
  size_t bytes = (argc > 2 ? strtoull(argv[2], 0, 10) : 512ull) << 20;
  CK(cudaSetDevice(dev));
  void *h, *d;
  CK(cudaMallocHost(&h, bytes));
  CK(cudaMalloc(&d, bytes));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> h2d, d2h;
  for (int dir = 0; dir < 2; ++dir) {
    for (int i = 0; i < 11; ++i) {
      CK(cudaEventRecord(a, s));
      if (dir == 0) CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, s));
      else CK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, s));
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float ms;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (i >= 2) (dir == 0 ? h2d : d2h).push_back(ms);
    }
  }
  printf("{\"device\": %d, \"bytes\": %zu, \"h2d_gbps\": %.3f, \"d2h_gbps\": %.3f}\n", dev, bytes,
         median_gbps(bytes, h2d), median_gbps(bytes, d2h));
  return 0;
}
