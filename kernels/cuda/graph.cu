// CUDA graphs behind the host API: capture of a stream's work, replay.
#include "kernels/cuda/common.cuh"

namespace tandem::kernels::cuda {

absl::Status BeginCapture(Stream stream) {
  return CudaStatus(cudaStreamBeginCapture(AsStream(stream), cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture");
}

absl::StatusOr<void*> EndCapture(Stream stream) {
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(AsStream(stream), &graph);
  if (e != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // capture errors are not sticky: clear them
    return CudaStatus(e, "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(e, "cudaGraphInstantiate");
  }
  return static_cast<void*>(exec);
}

absl::Status LaunchGraph(void* exec, Stream stream) {
  return CudaStatus(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), AsStream(stream)),
                    "cudaGraphLaunch");
}

void DestroyGraph(void* exec) {
  if (exec != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

}  // namespace tandem::kernels::cuda
