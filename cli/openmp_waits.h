#pragma once
#include <string>

namespace dsactor::cli {

// A trainer beside an offload service on the same cores: libgomp's threads spin between
// parallel regions (and while the rank waits on a fetch, a push or a commit), taking the
// cores the service needs, which then stalls the trainer's own threads in turn (in a
// profile of gpt2's stage-3 trainer and its service on 2 cores, libgomp's spinning took
// 4.7% of the samples; asleep, 0.1%). libgomp reads OMP_WAIT_POLICY once, when it loads, so
// the process must start with it: when it is unset, this logs `why` and re-executes the
// process (same pid, arguments and environment, plus OMP_WAIT_POLICY=passive). It returns
// when OMP_WAIT_POLICY is set, by the user or by that re-execution, and, with a warning,
// when the process cannot be re-executed (its threads then spin as before). Call it before
// any thread starts.
void sleep_idle_openmp_threads(const std::string& why);

}  // namespace dsactor::cli
