// SPDX-License-Identifier: Apache-2.0
#include "fixtures.hpp"

namespace ftp::test {

doc::GearTable sample_gears() {
  doc::GearTable t;
  t.model = doc::ModelShape{"llama-7b", 32, 32, 32, 4096, 7000000000ull};
  t.topology = "test";
  int next_dev = 0;
  auto gear = [&](std::string name, std::string role, int tp, double max_rps) {
    doc::Gear g;
    g.name = std::move(name);
    g.role = std::move(role);
    g.tp = tp;
    doc::Stage s;
    s.n_layers = 32;
    for (int i = 0; i < tp; ++i) s.devices.push_back("d" + std::to_string(next_dev++ % 8));
    g.replicas.push_back(doc::Replica{{s}});
    doc::Capacity c;
    c.max_rps = max_rps;
    c.safe_rps = 0.8 * max_rps;
    c.source = "estimate";
    g.estimated = c;
    t.gears.push_back(std::move(g));
  };
  gear("economy", "normal", 1, 150);
  gear("standard", "normal", 2, 600);
  gear("performance", "normal", 4, 1200);
  gear("memory-guard", "memory-guard", 2, 300);
  return t;
}

doc::Observation obs(double t_s, const std::string& gear, double rate) {
  doc::Observation o;
  o.t_ms = static_cast<std::int64_t>(t_s * 1000);
  o.gear = gear;
  o.request_rate = rate;
  o.mean_prompt_tokens = 512;
  o.queue_depth = o.queue_depth_mean = 0.5;
  o.est_queue_time_ms = 50;
  o.kv_watermark = 0.4;
  o.e2e_ms = {1000, 2000};
  return o;
}

doc::Observation busy(double t_s, const std::string& gear, double rate) {
  doc::Observation o = obs(t_s, gear, rate);
  o.queue_depth = o.queue_depth_mean = 20;
  o.est_queue_time_ms = 2000;
  return o;
}

}  // namespace ftp::test
