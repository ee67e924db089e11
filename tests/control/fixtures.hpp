// SPDX-License-Identifier: Apache-2.0
// Gear tables and observations for the control tests.
#pragma once

#include <string>

#include "doc/control.hpp"
#include "doc/gear_table.hpp"

namespace ftp::test {

/// economy (tp 1, 150 req/s max), standard (tp 2, 600), performance
/// (tp 4, 1200) and memory-guard (tp 2, 300); safe = 0.8 x max. Model
/// n_params 7e9.
doc::GearTable sample_gears();

/// An observation at t seconds on `gear` with arrivals `rate` req/s;
/// queue signals quiet.
doc::Observation obs(double t_s, const std::string& gear, double rate);

/// The same with queue signals that vote for an up-shift.
doc::Observation busy(double t_s, const std::string& gear, double rate);

}  // namespace ftp::test
