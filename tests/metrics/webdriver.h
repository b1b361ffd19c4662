#pragma once
// A headless Chromium driven over W3C WebDriver (Debian's chromium-driver), for the
// dashboard's browser test: start it, open a URL, run a script in the page, take a
// screenshot. Plain HTTP + JSON, so no selenium is needed.
#include <httplib.h>
#include <sodium.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "deploy/child_process.h"
#include "tests/deploy/deploy_test_util.h"

namespace dsactor::testing {

// Where Debian's packages put them; scripts/install-deps.sh installs both.
inline constexpr const char* kChromium = "/usr/bin/chromium";
inline constexpr const char* kChromedriver = "/usr/bin/chromedriver";

// Why there is no browser to drive, or "" when there is one.
inline std::string missing_browser() {
  for (const char* p : {kChromium, kChromedriver})
    if (!std::filesystem::exists(p))
      return std::string(p) +
             " is missing: run scripts/install-deps.sh (it installs Debian's chromium and "
             "chromium-driver)";
  return "";
}

class HeadlessBrowser {
 public:
  // Starts chromedriver on a free port and opens a headless Chromium session; throws
  // std::runtime_error saying what failed.
  explicit HeadlessBrowser(const std::filesystem::path& log) {
    port_ = free_port();
    deploy::ChildOptions o;
    o.out = deploy::Output::to_file(log);
    o.err = deploy::Output::same_as_stdout();
    driver_ = deploy::ChildProcess::exec({kChromedriver, "--port=" + std::to_string(port_)}, o);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", port_);
    client_->set_read_timeout(std::chrono::seconds(120));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!client_->Get("/status")) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("chromedriver did not answer on port " + std::to_string(port_));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const nlohmann::json caps = {
        {"capabilities",
         {{"alwaysMatch",
           {{"browserName", "chrome"},
            {"goog:chromeOptions",
             {{"binary", kChromium},
              {"args",
               {"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"}}}}}}}}};
    session_ = call("POST", "/session", caps)["sessionId"].get<std::string>();
  }
  ~HeadlessBrowser() {
    if (!session_.empty()) client_->Delete(("/session/" + session_).c_str());
  }

  void open(const std::string& url) { call("POST", path("/url"), {{"url", url}}); }
  // The value of `script` (a function body: `return ...;`) run in the page.
  nlohmann::json run(const std::string& script) {
    return call("POST", path("/execute/sync"),
                {{"script", script}, {"args", nlohmann::json::array()}});
  }
  void screenshot(const std::filesystem::path& png) {
    const std::string b64 = call("GET", path("/screenshot"))["value"].get<std::string>();
    std::vector<unsigned char> bytes(b64.size());
    size_t n = 0;
    if (sodium_base642bin(bytes.data(), bytes.size(), b64.data(), b64.size(), nullptr, &n, nullptr,
                          sodium_base64_VARIANT_ORIGINAL) != 0)
      throw std::runtime_error("the screenshot is not base64");
    std::ofstream(png, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), n);
  }

 private:
  std::string path(const std::string& what) const { return "/session/" + session_ + what; }
  nlohmann::json call(const std::string& method, const std::string& p,
                      const nlohmann::json& body = nullptr) {
    auto res = method == "GET" ? client_->Get(p.c_str())
                               : client_->Post(p.c_str(), body.dump(), "application/json");
    if (!res) throw std::runtime_error("chromedriver: no answer to " + method + " " + p);
    const auto j = nlohmann::json::parse(res->body);
    if (res->status != 200)
      throw std::runtime_error("chromedriver: " + method + " " + p + ": " + res->body);
    return p == "/session" ? j["value"] : j;
  }

  int port_ = 0;
  deploy::ChildProcess driver_;
  std::unique_ptr<httplib::Client> client_;
  std::string session_;
};

}  // namespace dsactor::testing
