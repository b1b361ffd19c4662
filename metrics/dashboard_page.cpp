// The dashboard's page as the server renders it: every role's figures in tables, which is
// all a browser without JavaScript shows; the script (assets/dashboard.js) redraws the same
// sections from /api/deployment and adds the charts.
#include <fmt/format.h>

#include <set>

#include "metrics/dashboard.h"
#include "metrics/state_figures.h"

namespace dsactor::metrics {

namespace {

using nlohmann::json;

std::string labels_text(const json& labels) {
  std::string out;
  for (const auto& [k, v] : labels.items()) {
    if (!out.empty()) out += ", ";
    out += k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return out;
}

std::string value_text(const json& series) {
  auto one = [](const json& v) {
    return v.is_number() ? fmt::format("{:.6g}", v.get<double>()) : std::string("NaN");
  };
  if (series.contains("value")) return one(series["value"]);
  return "sum " + one(series["sum"]) + ", count " + one(series["count"]);
}

// The actors a role's series name (their `actor` label), in order.
std::set<std::string> actors_of(const json& state) {
  std::set<std::string> actors;
  if (state.contains("process") && state["process"].contains("actors"))
    for (const auto& a : state["process"]["actors"]) actors.insert(a.get<std::string>());
  if (!state.contains("metrics")) return actors;
  for (const auto& [name, family] : state["metrics"].items())
    for (const auto& s : family["series"])
      if (s["labels"].contains("actor")) actors.insert(s["labels"]["actor"].get<std::string>());
  return actors;
}

std::string figures_table(const json& state) {
  std::string out =
      "<table class=\"figures\"><thead><tr><th>figure</th><th>labels</th><th>value</th></tr>"
      "</thead><tbody>";
  if (state.contains("metrics"))
    for (const auto& [name, family] : state["metrics"].items())
      for (const auto& s : family["series"])
        out += fmt::format("<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
                           html_escape(name), html_escape(labels_text(s["labels"])),
                           html_escape(value_text(s)));
  return out + "</tbody></table>";
}

// The role's link rates (Dashboard's "links"), as the script's "Link rates" panel shows them.
std::string links_table(const json& role) {
  if (!role.contains("links") || role["links"].empty()) return {};
  std::string out =
      "<table class=\"figures links\"><thead><tr><th>link</th><th>bytes/s</th></tr></thead>"
      "<tbody>";
  for (const auto& l : role["links"]) {
    const json& rate = l["bytes_per_second"];
    out += fmt::format("<tr><td>{}</td><td class=\"num\">{}</td></tr>",
                       html_escape(l["link"].get<std::string>()),
                       rate.is_number() ? fmt::format("{:.6g}", rate.get<double>()) : "&ndash;");
  }
  return out + "</tbody></table>";
}

std::string role_section(const json& role) {
  const json& state = role["state"];
  std::string actors;
  for (const auto& a : actors_of(state)) {
    const auto error = text_of(state, "dsactor_actor_last_error", {{"actor", a}});
    actors += fmt::format(
        "<li class=\"actor\" data-actor=\"{0}\">{0}{1}</li>", html_escape(a),
        error && !error->empty()
            ? "<span class=\"fig last-error\">last error: " + html_escape(*error) + "</span>"
            : "");
  }
  const std::string status =
      role["up"].get<bool>() ? "up" : "down: " + role["error"].get<std::string>();
  return fmt::format(
      "<section class=\"role\" data-role=\"{0}\" data-kind=\"{1}\"><h3>{0} <small>{1}</small>"
      "</h3><p class=\"status\">{2} &middot; {3}</p><ul class=\"actors\">{4}</ul>{5}{6}"
      "</section>",
      html_escape(role["name"].get<std::string>()), html_escape(role["kind"].get<std::string>()),
      html_escape(status), html_escape(role["url"].get<std::string>()), actors, links_table(role),
      figures_table(state));
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_dashboard_html(const json& deployment, const std::string& token) {
  const std::string query = token.empty() ? "" : "?token=" + html_escape(token);
  const std::string job = html_escape(deployment["job"].get<std::string>());
  std::string roles;
  for (const auto& r : deployment["roles"]) roles += role_section(r);
  return fmt::format(
      "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta name=\"viewport\" content=\"width=device-width\">"
      "<title>dsactor &middot; {0}</title>"
      "<link rel=\"stylesheet\" href=\"/assets/dashboard.css{1}\"></head><body>"
      "<header><h1>dsactor <span class=\"job\">{0}</span></h1>"
      "<span id=\"updated\">{2} role(s)</span>"
      "<noscript>Without JavaScript: the figures below as of this page's load; reload for "
      "new ones.</noscript></header>"
      "<main><div id=\"charts\"></div><div id=\"timeline\"></div><div id=\"tiers\"></div>"
      "<div id=\"links\"></div>"
      "<h2>Processes</h2><div id=\"topology\">{3}</div></main>"
      "<script src=\"/assets/dashboard.js{1}\"></script></body></html>",
      job, query, deployment["roles"].size(), roles);
}

}  // namespace dsactor::metrics
