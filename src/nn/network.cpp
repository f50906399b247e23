#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include <set>

#include "medfast/core/error.hpp"
#include "medfast/nn/segresnet.hpp"
#include "medfast/nn/swin_unetr.hpp"
#include "medfast/nn/unet.hpp"

namespace medfast::nn {

namespace {

/// Reads optional arguments from a spec and rejects the ones no reader asked for.
class Args {
 public:
  Args(const nlohmann::json& spec, std::string where) : spec_(spec), where_(std::move(where)) {
    if (!spec_.is_object()) throw ValueError(str(where_, ": expected a mapping with a 'name'"));
    seen_.insert("name");
  }
  template <typename T>
  void get(const char* key, T& out) {
    seen_.insert(key);
    if (!spec_.contains(key) || spec_[key].is_null()) return;
    try {
      out = spec_[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      throw ValueError(str(where_, ".", key, ": unexpected value ", spec_[key].dump()));
    }
  }
  void done() const {
    for (const auto& [k, v] : spec_.items()) {
      if (!seen_.count(k)) throw ValueError(str(where_, ": unknown argument '", k, "' for ", spec_.value("name", "")));
    }
  }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json& spec_;
  std::string where_;
  std::set<std::string> seen_;
};

/// Builds a module, prefixing its argument errors with where it was configured.
template <typename F>
auto construct(const std::string& where, F&& f) {
  try {
    return f();
  } catch (const ValueError& e) {
    throw ValueError(str(where, ": ", e.what()));
  }
}

UNet network_for(const UNetOptions& o) { return UNet(o); }
SegResNet network_for(const SegResNetOptions& o) { return SegResNet(o); }
SwinUNETR network_for(const SwinUNETROptions& o) { return SwinUNETR(o); }

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

NetworkOptions parse_network(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_object() || !spec.contains("name") || !spec["name"].is_string()) {
    throw ValueError(str(where, ": expected a mapping with a 'name' (UNet, SegResNet or SwinUNETR)"));
  }
  const std::string name = spec["name"];
  Args a(spec, where);
  {
    if (name == "UNet") {
      UNetOptions o;
      a.get("spatial_dims", o.spatial_dims);
      a.get("in_channels", o.in_channels);
      a.get("out_channels", o.out_channels);
      a.get("channels", o.channels);
      a.get("strides", o.strides);
      a.get("kernel_size", o.kernel_size);
      a.get("up_kernel_size", o.up_kernel_size);
      a.get("num_res_units", o.num_res_units);
      a.get("norm", o.norm);
      o.norm = lower(o.norm);
      a.get("dropout", o.dropout);
      a.done();
      construct(where, [&] { o.validate(); });
      return o;
    }
    if (name == "SegResNet") {
      SegResNetOptions o;
      a.get("spatial_dims", o.spatial_dims);
      a.get("init_filters", o.init_filters);
      a.get("in_channels", o.in_channels);
      a.get("out_channels", o.out_channels);
      a.get("dropout_prob", o.dropout_prob);  // null (MONAI's default) = no dropout
      a.get("act", o.act);
      o.act = lower(o.act);
      a.get("norm", o.norm);
      o.norm = lower(o.norm);
      a.get("num_groups", o.num_groups);
      a.get("blocks_down", o.blocks_down);
      a.get("blocks_up", o.blocks_up);
      a.get("upsample_mode", o.upsample_mode);
      o.upsample_mode = lower(o.upsample_mode);
      a.done();
      construct(where, [&] { o.validate(); });
      return o;
    }
    if (name == "SwinUNETR") {
      SwinUNETROptions o;
      if (spec.contains("img_size") && spec["img_size"].is_number_integer()) {  // MONAI's ensure_tuple_rep
        std::int64_t s = 0;
        a.get("img_size", s);
        o.img_size = {s, s, s};
      } else {
        a.get("img_size", o.img_size);
      }
      a.get("in_channels", o.in_channels);
      a.get("out_channels", o.out_channels);
      a.get("depths", o.depths);
      a.get("num_heads", o.num_heads);
      a.get("feature_size", o.feature_size);
      a.get("norm_name", o.norm_name);
      o.norm_name = lower(o.norm_name);
      a.get("drop_rate", o.drop_rate);
      a.get("attn_drop_rate", o.attn_drop_rate);
      a.get("dropout_path_rate", o.dropout_path_rate);
      a.get("normalize", o.normalize);
      a.get("spatial_dims", o.spatial_dims);
      a.get("downsample", o.downsample);
      o.downsample = lower(o.downsample);
      a.get("use_v2", o.use_v2);
      a.done();
      construct(where, [&] { o.validate(); });
      return o;
    }
  }
  throw ValueError(str(where, ".name: unknown network '", name, "' (expected UNet, SegResNet or SwinUNETR)"));
}

torch::nn::AnyModule make_network(const nlohmann::json& spec, const std::string& where) {
  const NetworkOptions options = parse_network(spec, where);
  return construct(where, [&] {
    return std::visit([](const auto& o) { return torch::nn::AnyModule(network_for(o)); }, options);
  });
}

}  // namespace medfast::nn
