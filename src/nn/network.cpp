#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include <set>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/nn/pretrained.hpp"
#include "medfast/nn/segresnet.hpp"
#include "medfast/nn/swin_unetr.hpp"
#include "medfast/nn/unet.hpp"

namespace medfast::nn {

namespace {

/// Builds a module, prefixing its argument errors with where it was configured.
template <typename F>
auto construct(const std::string& where, F&& f) {
  try {
    return f();
  } catch (const ConfigError&) {
    throw;
  } catch (const ValueError& e) {
    throw ConfigError(str(where, ": ", e.what()));
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
    throw ConfigError(str(where, ": expected a mapping with a 'name' (UNet, SegResNet or SwinUNETR)"));
  }
  const std::string name = spec["name"];
  ConfigReader a(spec, where, ConfigReader::Naming{ConfigReader::Style::argument, "argument", name});
  a.known("name");
  if (spec.contains("pretrained") && !spec["pretrained"].is_string() && !spec["pretrained"].is_null()) {
    throw ConfigError(str(where, ".pretrained: expected a file name (a state_dict saved by torch.save), got ",
                          spec["pretrained"].dump()));
  }
  a.known("pretrained");
  {
    if (name == "UNet") {
      UNetOptions o;
      a.read("spatial_dims", o.spatial_dims);
      a.read("in_channels", o.in_channels);
      a.read("out_channels", o.out_channels);
      a.read("channels", o.channels);
      a.read("strides", o.strides);
      a.read("kernel_size", o.kernel_size);
      a.read("up_kernel_size", o.up_kernel_size);
      a.read("num_res_units", o.num_res_units);
      a.read("norm", o.norm);
      o.norm = lower(o.norm);
      a.read("dropout", o.dropout);
      a.finish();
      construct(where, [&] { o.validate(); });
      return o;
    }
    if (name == "SegResNet") {
      SegResNetOptions o;
      a.read("spatial_dims", o.spatial_dims);
      a.read("init_filters", o.init_filters);
      a.read("in_channels", o.in_channels);
      a.read("out_channels", o.out_channels);
      a.read("dropout_prob", o.dropout_prob);  // null (MONAI's default) = no dropout
      a.read("act", o.act);
      o.act = lower(o.act);
      a.read("norm", o.norm);
      o.norm = lower(o.norm);
      a.read("num_groups", o.num_groups);
      a.read("blocks_down", o.blocks_down);
      a.read("blocks_up", o.blocks_up);
      a.read("upsample_mode", o.upsample_mode);
      o.upsample_mode = lower(o.upsample_mode);
      a.finish();
      construct(where, [&] { o.validate(); });
      return o;
    }
    if (name == "SwinUNETR") {
      SwinUNETROptions o;
      if (spec.contains("img_size") && spec["img_size"].is_number_integer()) {  // MONAI's ensure_tuple_rep
        std::int64_t s = 0;
        a.read("img_size", s);
        o.img_size = {s, s, s};
      } else {
        a.read("img_size", o.img_size);
      }
      a.read("in_channels", o.in_channels);
      a.read("out_channels", o.out_channels);
      a.read("depths", o.depths);
      a.read("num_heads", o.num_heads);
      a.read("feature_size", o.feature_size);
      a.read("norm_name", o.norm_name);
      o.norm_name = lower(o.norm_name);
      a.read("drop_rate", o.drop_rate);
      a.read("attn_drop_rate", o.attn_drop_rate);
      a.read("dropout_path_rate", o.dropout_path_rate);
      a.read("normalize", o.normalize);
      a.read("spatial_dims", o.spatial_dims);
      a.read("downsample", o.downsample);
      o.downsample = lower(o.downsample);
      a.read("use_v2", o.use_v2);
      a.finish();
      construct(where, [&] { o.validate(); });
      return o;
    }
  }
  throw ConfigError(str(where, ".name: unknown network '", name, "' (expected UNet, SegResNet or SwinUNETR)"));
}

torch::nn::AnyModule make_network(const nlohmann::json& spec, const std::string& where) {
  const NetworkOptions options = parse_network(spec, where);
  torch::nn::AnyModule net = construct(where, [&] {
    return std::visit([](const auto& o) { return torch::nn::AnyModule(network_for(o)); }, options);
  });
  if (spec.contains("pretrained") && spec["pretrained"].is_string()) {
    const std::string file = spec["pretrained"].get<std::string>();
    const PretrainedReport r = load_state_dict_file(file, *net.ptr());
    log::info(where, ": ", r.tensors, " tensors (", r.elements, " values) from ", file);
  }
  return net;
}

}  // namespace medfast::nn
