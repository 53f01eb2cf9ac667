// Averages the flat gradient buffer ON THE DEVICE across ranks, bucket by bucket, while backward is
// still running (the CUDA backend's GradReducer; the plan is the same immutable BucketPlan).
//   --comm nccl: per bucket, the communication stream waits on an event recorded on the compute stream
//     when the blocks covering the bucket have been enqueued, then runs ncclAllReduce(ncclAvg) in
//     place. No host synchronisation inside backward. finish() waits for the last bucket, polling
//     ncclCommGetAsyncError with a timeout, so a lost peer ends the job instead of hanging it.
//   --comm mpi: host-staged (copy down, MPI_Allreduce, copy up) in finish(). Slow, but it lets several
//     ranks share one GPU, which NCCL refuses: that is how multi-rank GPU runs are tested on one GPU.
// Every rank issues the same buckets in the same order (BucketPlan order).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "kernels/common/cuda_dtype.hpp"
#include "kernels/common/device_buffer.hpp"

namespace gpt2 {

enum class DeviceComm { kNccl, kMpi };
DeviceComm parse_device_comm(const std::string& name);  // "nccl" | "mpi"

// The GPU this rank uses: its local rank. With NCCL two ranks may not share a GPU (an error that
// suggests --comm mpi); with --comm mpi ranks beyond the GPU count share them round-robin.
// Calls cudaSetDevice and records the device for error messages.
int select_device(int local_rank, int local_size, DeviceComm comm);

class NcclComm;  // defined in device_reducer.cpp (keeps nccl.h out of this header)

class DeviceGradReducer {
 public:
  // grads: the device gradient buffer (plan covers it), elements of `dtype`. compute: the stream
  // backward runs on. timeout_s: how long finish() waits before declaring a peer lost.
  DeviceGradReducer(DeviceComm kind, const BucketPlan& plan, void* grads, Precision dtype, cudaStream_t compute,
                    double timeout_s, MPI_Comm world = MPI_COMM_WORLD);
  ~DeviceGradReducer();
  DeviceGradReducer(const DeviceGradReducer&) = delete;
  DeviceGradReducer& operator=(const DeviceGradReducer&) = delete;

  // Call before the backward of the step's last micro-step.
  void begin_step();
  // Backward has enqueued every gradient at offset >= ready_from: launch, in plan order, every bucket
  // that is now complete (NCCL: on the communication stream after an event; MPI: deferred to finish()).
  void on_grads_ready(size_t ready_from);
  // Launches anything left, makes the compute stream wait for the last bucket, and waits on the host
  // (with the timeout). Returns the communication time backward did not hide, in ms: NCCL, from the
  // end of backward on the device to the end of the last bucket; MPI, all of it.
  double finish();

 private:
  void launch(size_t bucket);
  double finish_mpi();
  void wait_with_timeout(cudaEvent_t done);

  DeviceComm kind_;
  const BucketPlan& plan_;
  char* grads_;
  Precision dtype_;
  size_t elem_bytes_;
  cudaStream_t compute_;
  double timeout_s_;
  MPI_Comm world_;
  int rank_ = 0, size_ = 1;
  size_t next_ = 0;
  std::unique_ptr<CudaStream> comm_stream_;
  std::vector<std::unique_ptr<CudaEvent>> ready_;  // per bucket
  std::unique_ptr<CudaEvent> compute_done_, comm_done_;  // timing events for comm_exposed_ms
  std::unique_ptr<NcclComm> nccl_;
  std::vector<float> host_;  // MPI staging
};

}  // namespace gpt2
