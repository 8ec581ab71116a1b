#include "metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

namespace spawnpoint::metrics {
namespace {

// The series key: the values joined so that distinct value lists never collide and keys
// sort like the value lists do. NUL separates values and is itself escaped as NUL 0x01.
std::string Key(const std::vector<std::string>& values) {
  size_t n = values.size() * 2;
  for (const auto& v : values) n += v.size();
  std::string key;
  key.reserve(n);
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) key.append(1, '\0').append(1, '\0');
    for (char c : values[i]) {
      key.push_back(c);
      if (c == '\0') key.push_back('\x01');
    }
  }
  return key;
}

void AppendSeriesName(std::string* out, const std::string& name, const char* suffix,
                      const std::string& label_text) {
  out->append(name);
  out->append(suffix);
  if (!label_text.empty()) {
    out->push_back('{');
    out->append(label_text);
    out->push_back('}');
  }
  out->push_back(' ');
}

void AppendUnsigned(std::string* out, uint64_t v) {
  char buf[24];
  char* p = buf + sizeof(buf);
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  out->append(p, buf + sizeof(buf));
}

std::string Header(const std::string& name, const std::string& help, MetricType type) {
  std::string h = "# HELP " + name + " ";
  AppendEscapedHelp(&h, help);
  h += "\n# TYPE " + name + " " + MetricTypeName(type) + "\n";
  return h;
}

// Index of each subset label in `names`, or empty if one is missing.
std::vector<std::pair<size_t, const std::string*>> MatchPlan(const std::vector<std::string>& names,
                                                             const Labels& subset) {
  std::vector<std::pair<size_t, const std::string*>> plan;
  for (const auto& [label, value] : subset) {
    auto it = std::find(names.begin(), names.end(), label);
    if (it == names.end()) return {};
    plan.emplace_back(static_cast<size_t>(it - names.begin()), &value);
  }
  return plan;
}

}  // namespace

void Counter::Inc(double delta) {
  if (!(delta >= 0)) return;  // also false for NaN
  value_.fetch_add(delta, std::memory_order_relaxed);
}

Histogram::Histogram(std::shared_ptr<const std::vector<double>> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<uint64_t>[bounds_->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const auto& b = *bounds_;
  // The first bound >= value: "le" is inclusive. Bucket lists are short, and a linear scan
  // over a dozen doubles beats a binary search's branch mispredictions.
  size_t i = 0;
  while (i < b.size() && value > b[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Take() const {
  Snapshot s;
  s.cumulative.reserve(bounds_->size() + 1);
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    cum += counts_[i].load(std::memory_order_relaxed);
    s.cumulative.push_back(cum);
  }
  s.count = cum;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> DefaultBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  if (!(start > 0) || !(factor > 1)) return b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

std::vector<double> LinearBuckets(double start, double width, int count) {
  std::vector<double> b;
  if (!(width > 0)) return b;
  for (int i = 0; i < count; ++i) b.push_back(start + width * i);
  return b;
}

FamilyBase::FamilyBase(MetricSpec spec, MetricType type)
    : header_(Header(spec.name, spec.help, type)),
      name_(std::move(spec.name)),
      help_(std::move(spec.help)),
      type_(type),
      label_names_(std::move(spec.labels)) {}

template <typename T>
Family<T>::Family(MetricSpec spec, MetricType type,
                  std::shared_ptr<const std::vector<double>> bounds)
    : FamilyBase(std::move(spec), type), bounds_(std::move(bounds)) {
  if (bounds_) {
    for (double b : *bounds_) bound_text_.push_back(FormatValue(b));
  }
}

template <typename T>
std::shared_ptr<T> Family<T>::Make() const {
  if constexpr (std::is_same_v<T, Histogram>) {
    return std::make_shared<Histogram>(bounds_);
  } else {
    return std::make_shared<T>();
  }
}

template <typename T>
StatusOr<std::shared_ptr<T>> Family<T>::Get(const std::vector<std::string>& values) {
  if (values.size() != label_names().size()) {
    return InvalidArgument(name() + " takes " + std::to_string(label_names().size()) +
                           " label values, not " + std::to_string(values.size()));
  }
  const std::string key = Key(values);
  {
    std::shared_lock lock(mu_);
    auto it = series_.find(key);
    if (it != series_.end()) return it->second.metric;
  }
  std::unique_lock lock(mu_);
  auto [it, inserted] = series_.try_emplace(key);
  if (inserted) {
    it->second.values = values;
    it->second.label_text = FormatLabelPairs(label_names(), values);
    it->second.metric = Make();
  }
  return it->second.metric;
}

template <typename T>
std::shared_ptr<T> Family<T>::WithLabels(const std::vector<std::string>& values) {
  auto s = Get(values);
  if (s.ok()) return *s;
  misuses_.fetch_add(1, std::memory_order_relaxed);
  return Make();
}

template <typename T>
bool Family<T>::Remove(const std::vector<std::string>& values) {
  if (values.size() != label_names().size()) return false;
  std::unique_lock lock(mu_);
  return series_.erase(Key(values)) > 0;
}

template <typename T>
size_t Family<T>::RemoveMatching(const Labels& subset) {
  const auto plan = MatchPlan(label_names(), subset);
  if (plan.empty() && !subset.empty()) return 0;
  std::unique_lock lock(mu_);
  size_t removed = 0;
  for (auto it = series_.begin(); it != series_.end();) {
    bool match = true;
    for (const auto& [index, value] : plan) match = match && it->second.values[index] == *value;
    if (match) {
      it = series_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

template <typename T>
void Family<T>::Clear() {
  std::unique_lock lock(mu_);
  series_.clear();
}

template <typename T>
size_t Family<T>::Size() const {
  std::shared_lock lock(mu_);
  return series_.size();
}

template <typename T>
void Family<T>::RenderTo(std::string* out) const {
  std::shared_lock lock(mu_);
  if (series_.empty()) return;
  out->append(header_);
  for (const auto& [key, s] : series_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram& h = *s.metric;
      // The le label goes last, after the series' own labels.
      const std::string& labels = s.label_text;
      uint64_t cum = 0;
      const size_t n = bound_text_.size();
      for (size_t i = 0; i <= n; ++i) {
        cum += h.counts_[i].load(std::memory_order_relaxed);
        out->append(name());
        out->append("_bucket{");
        if (!labels.empty()) {
          out->append(labels);
          out->push_back(',');
        }
        out->append("le=\"");
        out->append(i < n ? bound_text_[i] : std::string_view("+Inf"));
        out->append("\"} ");
        AppendUnsigned(out, cum);
        out->push_back('\n');
      }
      AppendSeriesName(out, name(), "_sum", labels);
      AppendValue(out, h.sum_.load(std::memory_order_relaxed));
      out->push_back('\n');
      // The +Inf bucket, so _count always equals it even while observations race the scrape.
      AppendSeriesName(out, name(), "_count", labels);
      AppendUnsigned(out, cum);
      out->push_back('\n');
    } else {
      AppendSeriesName(out, name(), "", s.label_text);
      AppendValue(out, s.metric->Value());
      out->push_back('\n');
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Status Registry::CheckNew(const MetricSpec& spec, MetricType type) const {
  SP_RETURN_IF_ERROR(ValidateMetricName(spec.name));
  if (spec.check_conventions) SP_RETURN_IF_ERROR(CheckNamingConventions(spec.name, type));
  std::set<std::string> seen;
  for (const auto& l : spec.labels) {
    SP_RETURN_IF_ERROR(ValidateLabelName(l).WithPrefix(spec.name));
    if (!seen.insert(l).second) {
      return InvalidArgument(spec.name + ": label \"" + l + "\" is given twice");
    }
    if (type == MetricType::kHistogram && l == "le") {
      return InvalidArgument(spec.name + ": \"le\" is the histogram's own bucket label");
    }
  }
  std::vector<std::string> names = {spec.name};
  if (type == MetricType::kHistogram) {
    for (const char* s : {"_bucket", "_sum", "_count"}) names.push_back(spec.name + s);
  }
  for (const auto& n : names) {
    auto it = sample_names_.find(n);
    if (it != sample_names_.end()) {
      return Status(StatusCode::kAlreadyExists,
                    "metric \"" + n + "\" is already registered (by " + it->second + ")");
    }
  }
  return Status::Ok();
}

template <typename T>
StatusOr<Family<T>*> Registry::Add(const MetricSpec& spec, MetricType type,
                                   std::shared_ptr<const std::vector<double>> bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  SP_RETURN_IF_ERROR(CheckNew(spec, type));
  std::unique_ptr<Family<T>> family(new Family<T>(spec, type, std::move(bounds)));
  Family<T>* raw = family.get();
  if (spec.labels.empty()) (void)raw->Get({});
  sample_names_[spec.name] = spec.name;
  if (type == MetricType::kHistogram) {
    for (const char* s : {"_bucket", "_sum", "_count"}) sample_names_[spec.name + s] = spec.name;
  }
  by_name_[spec.name] = raw;
  families_.push_back(std::move(family));
  return raw;
}

StatusOr<Family<Counter>*> Registry::AddCounter(const MetricSpec& spec) {
  return Add<Counter>(spec, MetricType::kCounter, nullptr);
}

StatusOr<Family<Gauge>*> Registry::AddGauge(const MetricSpec& spec) {
  return Add<Gauge>(spec, MetricType::kGauge, nullptr);
}

StatusOr<Family<Histogram>*> Registry::AddHistogram(const MetricSpec& spec,
                                                    std::vector<double> bounds) {
  if (!bounds.empty() && std::isinf(bounds.back()) && bounds.back() > 0) bounds.pop_back();
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return InvalidArgument(spec.name + ": bucket bounds must be finite (+Inf is implicit)");
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return InvalidArgument(spec.name + ": bucket bounds must be strictly increasing, but " +
                             FormatValue(bounds[i]) + " follows " + FormatValue(bounds[i - 1]));
    }
  }
  return Add<Histogram>(spec, MetricType::kHistogram,
                        std::make_shared<const std::vector<double>>(std::move(bounds)));
}

int Registry::AddCollector(Collector collector) {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_collector_++;
  collectors_[id] = std::move(collector);
  return id;
}

bool Registry::RemoveCollector(int id) {
  bool removed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    removed = collectors_.erase(id) > 0;
  }
  // Renders that copied the collector before it was erased may still be running it: wait
  // for them, so the caller may destroy what the collector reads once this returns.
  std::unique_lock<std::shared_mutex> drained(collecting_);
  return removed;
}

size_t Registry::RemoveMatching(const Labels& subset) {
  std::vector<FamilyBase*> families;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& f : families_) families.push_back(f.get());
  }
  size_t removed = 0;
  for (FamilyBase* f : families) removed += f->RemoveMatching(subset);
  return removed;
}

void Registry::CollectError(const std::string& message) const {
  collect_errors_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(error_mu_);
  last_collect_error_ = message;
}

std::string Registry::LastCollectError() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return last_collect_error_;
}

namespace {

// Appends the valid samples of collected families `group` (all of one name) to `out`;
// `with_header` adds their HELP and TYPE (not when they join a registered family's group).
void RenderCollected(const std::vector<const CollectedFamily*>& group, bool with_header,
                     std::string* out) {
  bool any = false;
  for (const CollectedFamily* f : group) any = any || !f->samples.empty();
  if (!any) return;
  const CollectedFamily& first = *group.front();
  if (with_header) out->append(Header(first.name, first.help, first.type));
  for (const CollectedFamily* f : group) {
    for (const auto& s : f->samples) {
      if (s.label_values.size() != f->label_names.size()) continue;  // counted by the caller
      AppendSeriesName(out, f->name, "", FormatLabelPairs(f->label_names, s.label_values));
      AppendValue(out, s.value);
      out->push_back('\n');
    }
  }
}

}  // namespace

void Registry::RenderTo(std::string* out) const {
  std::vector<FamilyBase*> families;
  std::vector<Collector> collectors;
  std::vector<CollectedFamily> collected;
  {
    // Shared: concurrent scrapes collect at once; RemoveCollector waits for them.
    std::shared_lock<std::shared_mutex> collecting(collecting_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      families.reserve(families_.size());
      for (const auto& f : families_) families.push_back(f.get());
      for (const auto& [id, c] : collectors_) collectors.push_back(c);
    }
    // Collectors run outside the registry's lock: they may be slow (a GPU query).
    for (const auto& c : collectors) c(&collected);
  }

  // Valid collected families grouped by name, in first-seen order.
  std::vector<std::vector<const CollectedFamily*>> groups;
  std::unordered_map<std::string, size_t> group_of;
  for (const auto& f : collected) {
    Status s = ValidateMetricName(f.name);
    if (s.ok() && f.type == MetricType::kHistogram) {
      s = InvalidArgument(f.name + ": collectors cannot return histograms");
    }
    if (s.ok() && f.check_conventions) s = CheckNamingConventions(f.name, f.type);
    for (const auto& l : f.label_names) {
      if (s.ok()) s = ValidateLabelName(l).WithPrefix(f.name);
    }
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      auto reg = by_name_.find(f.name);
      if (reg != by_name_.end() &&
          (reg->second->type() != f.type || reg->second->label_names() != f.label_names)) {
        s = InvalidArgument(f.name + ": collected with another type or labels than registered");
      } else if (reg == by_name_.end() && sample_names_.count(f.name) > 0) {
        s = InvalidArgument(f.name + ": a registered histogram's sample name");
      }
    }
    if (s.ok()) {
      auto [it, inserted] = group_of.try_emplace(f.name, groups.size());
      if (inserted) {
        groups.emplace_back();
      } else {
        const CollectedFamily& head = *groups[it->second].front();
        if (head.type != f.type || head.label_names != f.label_names) {
          s = InvalidArgument(f.name + ": collected twice with different types or labels");
        }
      }
      if (s.ok()) groups[it->second].push_back(&f);
    }
    if (!s.ok()) {
      CollectError(s.message());
      continue;
    }
    for (const auto& sample : f.samples) {
      if (sample.label_values.size() != f.label_names.size()) {
        CollectError(f.name + ": a sample has " + std::to_string(sample.label_values.size()) +
                     " label values for " + std::to_string(f.label_names.size()) + " labels");
      }
    }
  }

  std::vector<bool> merged(groups.size(), false);
  for (const FamilyBase* f : families) {
    const size_t before = out->size();
    f->RenderTo(out);
    auto it = groups.empty() ? group_of.end() : group_of.find(f->name());
    if (it != group_of.end()) {
      merged[it->second] = true;
      // Without series of its own the registered family wrote no header yet.
      RenderCollected(groups[it->second], out->size() == before, out);
    }
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    if (!merged[i]) RenderCollected(groups[i], /*with_header=*/true, out);
  }
}

std::string Registry::Render() const {
  std::string out;
  out.reserve(last_size_.load(std::memory_order_relaxed) + 256);
  RenderTo(&out);
  last_size_.store(out.size(), std::memory_order_relaxed);
  return out;
}

}  // namespace spawnpoint::metrics
