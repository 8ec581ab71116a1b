#include "agent/loader/in_process_loader.h"

#include <mutex>

#include "agent/loader/throughput_meter.h"
#include "agent/progress/progress_file.h"

namespace spawnpoint::loader {
namespace {

class InProcessLoader : public Loader {
 public:
  InProcessLoader(LoaderOptions o, std::unique_ptr<Dataset> ds, SamplerOptions sampler,
                  const Clock* clock)
      : opts_(std::move(o)),
        dataset_(std::move(ds)),
        sampler_(sampler),
        clock_(clock),
        tp_(clock->Now()) {}

  int64_t DatasetSize() const override { return sampler_.dataset_size; }
  int64_t BatchesPerEpoch() const override { return loader::BatchesPerEpoch(sampler_); }
  const LoaderOptions& options() const override { return opts_; }
  std::vector<pid_t> WorkerPids() const override { return {}; }

  Status StartEpoch(int64_t epoch) override {
    if (!error_.ok()) return error_;
    std::lock_guard<std::mutex> lock(mu_);
    batches_ = EpochBatches(sampler_, epoch);
    next_ = 0;
    epoch_ = epoch;
    ctx_ = WorkerContext{};
    ctx_.rank = sampler_.rank;
    ctx_.world_size = sampler_.world_size;
    ctx_.epoch = epoch;
    ctx_.seed = DeriveSeed(sampler_.seed, sampler_.rank, 0, epoch);
    ctx_.rng.seed(ctx_.seed);
    tp_.Started(clock_->Now());
    return Status::Ok();
  }

  StatusOr<BatchPtr> Next() override {
    if (!error_.ok()) return error_;
    if (epoch_ < 0) return FailedPrecondition("loader: Next() before StartEpoch()");
    if (next_ >= batches_.size()) return BatchPtr(nullptr);
    const auto start = clock_->Now();
    const int64_t index = static_cast<int64_t>(next_);
    const std::vector<int64_t>& indices = batches_[next_];
    auto writer = std::make_shared<BatchWriter>(BatchWriter::ForHeap());
    std::vector<Sample> samples;
    samples.reserve(indices.size());
    auto where = [&](int64_t i) {
      return "dataset \"" + opts_.dataset + "\" failed on sample index " + std::to_string(i) +
             " (batch " + std::to_string(index) + " of epoch " + std::to_string(epoch_) + ")";
    };
    for (int64_t i : indices) {
      try {
        StatusOr<Sample> s = dataset_->Get(i, ctx_);
        if (!s.ok()) return error_ = Internal(where(i) + ": " + s.status().message());
        samples.push_back(std::move(s).value());
      } catch (const std::exception& e) {
        return error_ = Internal(where(i) + ": threw an exception: " + e.what());
      } catch (...) {
        return error_ = Internal(where(i) + ": threw a non-standard exception");
      }
    }
    try {
      Status st = dataset_->Collate(samples, *writer, ctx_);
      if (!st.ok()) {
        return error_ = Internal("collating batch " + std::to_string(index) + " of epoch " +
                                 std::to_string(epoch_) + ": " + st.message());
      }
    } catch (const std::exception& e) {
      return error_ = Internal("collating batch " + std::to_string(index) + ": threw: " + e.what());
    }
    auto batch = std::make_unique<Batch>();
    batch->epoch = epoch_;
    batch->index = index;
    batch->sample_indices = indices;
    for (size_t f = 0; f < writer->fields().size(); ++f) {
      const auto& field = writer->fields()[f];
      batch->fields.push_back({field.spec.name, field.spec.dtype, field.spec.shape,
                               writer->FieldData(f), field.nbytes});
    }
    ++next_;
    progress::CountStep(progress::StepSource::kLoader);  // the rank's progress record
    const auto now = clock_->Now();
    std::lock_guard<std::mutex> lock(mu_);
    tp_.Waited(now - start);
    tp_.Consumed(now, static_cast<int64_t>(indices.size()));
    return MakeBatch(std::move(batch), [writer] {});
  }

  LoaderStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    LoaderStats s;
    tp_.Fill(s, clock_->Now());
    s.epoch = epoch_;
    return s;
  }

 private:
  // Constant after construction.
  const LoaderOptions opts_;
  const std::unique_ptr<Dataset> dataset_;
  const SamplerOptions sampler_;
  const Clock* const clock_;

  // Used by the training thread only.
  Status error_;
  std::vector<std::vector<int64_t>> batches_;
  size_t next_ = 0;
  WorkerContext ctx_;

  // Guarded by mu_ (Stats() reads them from any thread).
  mutable std::mutex mu_;
  int64_t epoch_ = -1;
  ThroughputMeter tp_;
};

}  // namespace

StatusOr<std::unique_ptr<Loader>> CreateInProcessLoader(LoaderOptions options,
                                                        SamplerOptions sampler,
                                                        const Clock* clock) {
  SP_ASSIGN_OR_RETURN(std::unique_ptr<Dataset> ds,
                      CreateDataset(options.dataset, options.dataset_arg));
  try {
    sampler.dataset_size = ds->Size();
  } catch (const std::exception& e) {
    return Internal("dataset \"" + options.dataset + "\": Size() threw: " + e.what());
  }
  return std::unique_ptr<Loader>(
      new InProcessLoader(std::move(options), std::move(ds), sampler, clock));
}

}  // namespace spawnpoint::loader
