// The trainer's records as JSON: stage times, one epoch's record (metrics.jsonl, the
// checkpoint's history) and the run's result; NaN is written as null and read back. And an
// epoch's record as TensorBoard scalars.
#include "medfast/train/trainer.hpp"

#include <cmath>

#include "detail.hpp"

namespace medfast::train {

using detail::nan_to_null;

namespace {

double null_to_nan(const nlohmann::json& j) { return j.is_number() ? j.get<double>() : std::nan(""); }

}  // namespace

nlohmann::json StageTimes::to_json() const {
  return {{"data_wait", data_wait}, {"copy", copy}, {"forward", forward}, {"backward", backward},
          {"optimizer", optimizer}, {"validation", validation}};
}

nlohmann::json EpochRecord::to_json() const {
  nlohmann::json j{{"epoch", epoch}, {"steps", steps}, {"skipped_steps", skipped_steps}, {"loss", loss}, {"lr", lr},
                   {"seconds", seconds}, {"elapsed", elapsed}, {"times", times.to_json()},
                   {"process_seconds", process_seconds},
                   {"samples", samples}, {"samples_per_second", samples_per_second},
                   {"peak_rss_bytes", peak_rss_bytes}};
  if (cuda_peak_allocated) j["cuda_peak_allocated_bytes"] = *cuda_peak_allocated;
  if (cuda_peak_reserved) j["cuda_peak_reserved_bytes"] = *cuda_peak_reserved;
  if (!gpu.is_null()) j["gpu"] = gpu;
  if (dice) {
    j["dice"] = nan_to_null(*dice);
    nlohmann::json per = nlohmann::json::array();
    for (double d : dice_per_class) per.push_back(nan_to_null(d));
    j["dice_per_class"] = per;
    if (class_names.size() == dice_per_class.size()) j["class_names"] = class_names;
  }
  if (hd95) j["hd95"] = nan_to_null(*hd95);
  if (nonfinite_validation_cases > 0) j["nonfinite_validation_cases"] = nonfinite_validation_cases;
  return j;
}

EpochRecord EpochRecord::from_json(const nlohmann::json& j) {
  EpochRecord r;
  r.epoch = j.at("epoch");
  r.steps = j.at("steps");
  r.skipped_steps = j.value("skipped_steps", 0);
  r.loss = j.at("loss");
  r.lr = j.at("lr");
  r.seconds = j.at("seconds");
  r.elapsed = j.at("elapsed");
  r.process_seconds = j.value("process_seconds", -1.0);
  // Absent in checkpoints written before these were recorded.
  r.samples = j.value("samples", std::int64_t{0});
  r.samples_per_second = j.value("samples_per_second", 0.0);
  r.peak_rss_bytes = j.value("peak_rss_bytes", std::uint64_t{0});
  if (j.contains("cuda_peak_allocated_bytes")) r.cuda_peak_allocated = j["cuda_peak_allocated_bytes"].get<std::uint64_t>();
  if (j.contains("cuda_peak_reserved_bytes")) r.cuda_peak_reserved = j["cuda_peak_reserved_bytes"].get<std::uint64_t>();
  if (j.contains("gpu")) r.gpu = j["gpu"];
  if (j.contains("dice")) {
    r.dice = null_to_nan(j["dice"]);
    for (const auto& d : j.at("dice_per_class")) r.dice_per_class.push_back(null_to_nan(d));
    if (j.contains("class_names")) r.class_names = j["class_names"].get<std::vector<std::string>>();
  }
  if (j.contains("hd95")) r.hd95 = null_to_nan(j["hd95"]);
  r.nonfinite_validation_cases = j.value("nonfinite_validation_cases", std::int64_t{0});
  const auto& t = j.at("times");
  r.times.data_wait = t.at("data_wait");
  r.times.copy = t.at("copy");
  r.times.forward = t.at("forward");
  r.times.backward = t.at("backward");
  r.times.optimizer = t.at("optimizer");
  r.times.validation = t.at("validation");
  return r;
}

nlohmann::json TrainResult::to_json() const {
  nlohmann::json h = nlohmann::json::array();
  for (const auto& e : history) h.push_back(e.to_json());
  const bool best = best_epoch > 0;
  nlohmann::json j{
      {"run_dir", run_dir},
      {"epochs", history.size()},
      {"best_dice", best ? nan_to_null(best_dice) : nlohmann::json(nullptr)},
      {"best_epoch", best ? nlohmann::json(best_epoch) : nlohmann::json(nullptr)},
      {"best_checkpoint", best_checkpoint.empty() ? nlohmann::json(nullptr) : nlohmann::json(best_checkpoint)},
      {"reached_target", reached_target},
      {"seconds", seconds},
      {"prepare_seconds", prepare_seconds},
      {"history", h}};
  j["class_names"] = class_names;
  if (!best) j["no_best_checkpoint"] = no_best_checkpoint;
  if (stopped) {
    j["stopped"] = {{"signal", stopped->signal}, {"epoch", stopped->epoch}, {"step", stopped->step},
                    {"mid_epoch", stopped->mid_epoch}};
  }
  j["time_to_target"] = time_to_target ? nlohmann::json(*time_to_target) : nlohmann::json(nullptr);
  return j;
}

namespace detail {

void epoch_events(profile::EventWriter& events, const EpochRecord& rec, std::int64_t first_class) {
  const double now = profile::unix_seconds();
  auto put = [&](const std::string& tag, double v) { events.scalar(tag, v, rec.epoch, now); };
  constexpr double kMiB = 1024.0 * 1024.0;
  put("epoch_loss", rec.loss);
  if (rec.dice) {
    put("val_mean_dice", *rec.dice);
    const bool named = rec.class_names.size() == rec.dice_per_class.size();
    for (std::size_t k = 0; k < rec.dice_per_class.size(); ++k) {
      put(named ? "val_dice/" + tag_name(rec.class_names[k]) : str("val_dice/class_", first_class + static_cast<std::int64_t>(k)),
          rec.dice_per_class[k]);
    }
  }
  if (rec.hd95) put("val_hd95", *rec.hd95);
  put("time/epoch", rec.seconds);
  const nlohmann::json stages = rec.times.to_json();
  for (const auto& [stage, seconds] : stages.items()) put("time/" + stage, seconds.get<double>());
  put("samples_per_second", rec.samples_per_second);
  if (rec.skipped_steps > 0) put("skipped_steps", rec.skipped_steps);
  put("memory/peak_rss_mib", static_cast<double>(rec.peak_rss_bytes) / kMiB);
  if (rec.cuda_peak_allocated) put("memory/cuda_peak_allocated_mib", static_cast<double>(*rec.cuda_peak_allocated) / kMiB);
  if (rec.cuda_peak_reserved) put("memory/cuda_peak_reserved_mib", static_cast<double>(*rec.cuda_peak_reserved) / kMiB);
  if (rec.gpu.is_object()) {
    for (const auto& [k, v] : rec.gpu.items()) {
      if (v.is_number() && k != "samples") put("gpu/" + k, v.get<double>());
    }
  }
}

}  // namespace detail

}  // namespace medfast::train
