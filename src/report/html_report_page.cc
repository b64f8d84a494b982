// The page side of the HTML report (html_report_model.h): a Page model as one
// self-contained HTML document. The style and the script are web/report.css and
// web/report.js, and the plotting library is ECharts; all three are embedded at build time
// (html_assets.h) and inlined here.
#include <fmt/format.h>

#include <string_view>
#include <variant>

#include "report/html_assets.h"
#include "report/html_report_model.h"

namespace exitscope::report::html {
namespace {

using nlohmann::json;

// Text as HTML: & < > " as entities. The reports' own text uses two characters outside
// ASCII, U+2014 (em dash) and U+2265 (greater-than or equal), and they become &mdash; and
// &ge;.
std::string Esc(std::string_view s) {
  static constexpr std::string_view kMdash = "\u2014", kGe = "\u2265";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
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
      default:
        if (c == kMdash[0] && s.substr(i, kMdash.size()) == kMdash) {
          out += "&mdash;";
          i += kMdash.size() - 1;
        } else if (c == kGe[0] && s.substr(i, kGe.size()) == kGe) {
          out += "&ge;";
          i += kGe.size() - 1;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// JSON fit to sit inside <script type="application/json">: no '<' at all (only strings can
// hold one, and \u003c is the same string), invalid UTF-8 from the inputs replaced.
std::string ScriptJson(const json& j) {
  const std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '<')
      out += "\\u003c";
    else
      out += c;
  }
  return out;
}

// Script text fit to sit inside <script>: "</script" would end the element early.
std::string ScriptText(std::string_view js) {
  std::string out(js);
  for (size_t p = 0; (p = out.find("</script", p)) != std::string::npos; p += 2)
    out.replace(p, 2, "<\\/");
  return out;
}

std::string Paragraph(std::string_view cls, const Note& n) {
  if (!n.href.empty())
    return fmt::format("<p class=\"{}{}\"><a href=\"{}\">{}</a></p>\n", cls, n.warn ? " warn" : "",
                       Esc(n.href), Esc(n.text));
  return fmt::format("<p class=\"{}{}\">{}</p>\n", cls, n.warn ? " warn" : "", Esc(n.text));
}

// A section's blocks, in order; every plot's data goes to `charts`.
struct BlockWriter {
  std::string& out;
  json& charts;

  void operator()(const Note& n) { out += Paragraph("note", n); }
  void operator()(const Plot& p) {
    if (!p.note.empty()) out += Paragraph("note", Note{p.note});
    out +=
        fmt::format("<div class=\"chart\" id=\"{}\" data-kind=\"{}\"></div>\n",
                    Esc(p.data["id"].get<std::string>()), Esc(p.data["kind"].get<std::string>()));
    charts.push_back(p.data);
  }
  void operator()(const Heading& h) { out += fmt::format("<h3>{}</h3>\n", Esc(h.text)); }
  void operator()(const Table& t) {
    const auto cls = [&](size_t i) {
      return i < t.columns.size() && t.columns[i].key ? " class=\"k\"" : "";
    };
    out += "<table><tr>";
    for (size_t i = 0; i < t.columns.size(); ++i)
      out += fmt::format("<th{}>{}</th>", cls(i), Esc(t.columns[i].name));
    out += "</tr>\n";
    for (const auto& row : t.rows) {
      out += "<tr>";
      for (size_t i = 0; i < row.size(); ++i)
        out += fmt::format("<td{}>{}</td>", cls(i), Esc(row[i]));
      out += "</tr>\n";
    }
    out += "</table>\n";
  }
  void operator()(const Details& d) {
    out += fmt::format("<details><summary>{}</summary><pre>{}</pre></details>\n", Esc(d.summary),
                       Esc(d.text));
  }
};

}  // namespace

std::string RenderPage(const Page& page) {
  std::string nav, body;
  json charts = json::array();
  for (const Section& s : page.sections) {
    nav += fmt::format("<a href=\"#s-{}\">{}</a>", Esc(s.id), Esc(s.heading));
    body += fmt::format("<h2 id=\"s-{}\">{}</h2>\n", Esc(s.id), Esc(s.heading));
    BlockWriter w{body, charts};
    for (const Block& b : s.blocks) std::visit(w, b);
  }

  std::string out;
  out.reserve(PlotLibraryJs().size() + body.size() + (1 << 20));
  out +=
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      // Nothing leaves the page: no request of any kind is allowed.
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += fmt::format("<title>{}</title>\n<style>\n{}</style>\n</head>\n<body>\n", Esc(page.title),
                     ReportPageCss());
  out += fmt::format("<h1>{}</h1>\n", Esc(page.title));
  for (const Note& m : page.meta) out += Paragraph("meta", m);
  out += fmt::format("<nav>{}</nav>\n", nav);
  out += body;
  out += fmt::format(
      "<h2 id=\"about\">About this page</h2>\n<p class=\"note\">Written by exitscope; it "
      "opens offline and makes no request. Plots drawn by {} (npm package echarts, "
      "dist/echarts.common.min.js, inlined below with its licence).</p>\n"
      "<details><summary>Licence of the plotting library</summary><pre>{}</pre></details>\n",
      Esc(PlotLibraryName()), Esc(PlotLibraryLicense()));
  const json data = {{"charts", std::move(charts)}};
  out += "<script id=\"es-data\" type=\"application/json\">" + ScriptJson(data) +
         "</script>\n<script>\n" + ScriptText(PlotLibraryJs()) + "\n</script>\n<script>\n";
  out += ReportPageJs();
  out += "</script>\n</body>\n</html>\n";
  return out;
}

}  // namespace exitscope::report::html
