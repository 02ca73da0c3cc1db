// The one exception type fp4attn throws for bad input: the message names the
// argument, so a CLI or binding can print it as is.
#pragma once

#include <stdexcept>
#include <string>

namespace fp4attn {

class Error : public std::invalid_argument {
 public:
  Error(const std::string& argument, const std::string& problem)
      : std::invalid_argument(argument + ": " + problem), argument_(argument) {}
  const std::string& argument() const noexcept { return argument_; }

 private:
  std::string argument_;
};

}  // namespace fp4attn
