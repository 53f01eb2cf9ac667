// Averages the flat gradient buffer ON THE DEVICE across ranks, bucket by bucket, while backward is
// still running: the CUDA backend's side of the one BucketScheduler (comm/bucket_scheduler.hpp), which
// decides when each bucket goes; this class adds where the data is and the device-side ordering. Every
// collective goes through a Communicator, which owns the timeout and the flight record:
//   NCCL (device buffers, comm/nccl_communicator.hpp, created with the compute stream as its producer):
//     per bucket, the communication stream waits on an event recorded on the compute stream when the
//     blocks covering the bucket have been enqueued, then runs the average in place. No host
//     synchronisation inside backward; finish() waits for every bucket with the timeout and the compute
//     stream then waits for them on the device.
//   MPI (host buffers): host-staged in finish(): the whole buffer goes down as fp32, the scheduler runs
//     over the host copy, and it comes back up. Slow, but it lets several ranks share one GPU, which
//     NCCL refuses: that is how multi-rank GPU runs are tested on one GPU.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/bucket_plan.hpp"
#include "comm/bucket_scheduler.hpp"
#include "comm/communicator.hpp"
#include "kernels/common/cuda_dtype.hpp"
#include "kernels/common/device_buffer.hpp"

namespace gpt2 {

// The GPU this rank uses: its local rank. With NCCL two ranks may not share a GPU (an error that
// suggests --comm mpi); with --comm mpi ranks beyond the GPU count share them round-robin.
// Calls cudaSetDevice and records the device for error messages.
int select_device(int local_rank, int local_size, Comm comm);

class DeviceGradReducer {
 public:
  // comm: an NcclCommunicator whose producer is `compute` (device buffers) or an MPI one (host-staged).
  // grads: the device gradient buffer (plan covers it), elements of `dtype`. compute: the stream
  // backward runs on.
  // mode: kReduceScatter (ZeRO-1) needs the NCCL communicator (device buffers).
  DeviceGradReducer(Communicator& comm, const BucketPlan& plan, void* grads, Precision dtype, cudaStream_t compute,
                    BucketMode mode = BucketMode::kAllReduce);
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
  double finish_mpi();

  Communicator& comm_;
  bool on_device_;  // NCCL: buckets go out during backward; MPI: staged through the host in finish()
  const BucketPlan& plan_;
  void* grads_;
  Precision dtype_;
  cudaStream_t compute_;
  std::vector<float> host_;  // MPI staging: the whole buffer as fp32
  BucketScheduler scheduler_;  // over grads_ (NCCL) or host_ (MPI)
  std::unique_ptr<CudaEvent> compute_done_, comm_done_;  // timing events for comm_exposed_ms
};

}  // namespace gpt2
