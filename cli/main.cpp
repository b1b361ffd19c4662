#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"dsactor: ZeRO-3 / ZeRO-Infinity training with every memory tier as a service"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
