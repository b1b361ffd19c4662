#pragma once

#include <stdexcept>

namespace dsactor::trainer {

// Thrown for unusable training data (bad token file, empty corpus, data smaller than one
// batch, cursor from another loader geometry); the message names the file and numbers.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dsactor::trainer
