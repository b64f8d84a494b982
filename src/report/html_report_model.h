// report/html_report_model.h: the seam inside the HTML report (docs/html-report.md).
//
// Data shaping decides what a page shows and hands it over as this plain model:
// html_report.cc builds each report's page (its meta lines, sections and tables) and
// html_report_data.cc the plots' data. The page side, html_report_page.cc, turns a model
// into the HTML document, with the page's style and script (web/report.css, web/report.js)
// and the plotting library inlined. It is the only code that writes markup, and it escapes
// every text of the model: the model holds plain UTF-8 text, never HTML.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace exitscope::report::html {

// A paragraph: a meta line under the title, or a note in a section. `warn` shows it as a
// warning (red); `href` makes it a link.
struct Note {
  Note(std::string t = {}, bool w = false, std::string h = {})  // NOLINT: implicit from text
      : text(std::move(t)), warn(w), href(std::move(h)) {}
  std::string text;
  bool warn = false;
  std::string href;  // when set, the text links there ("#s-timeline": a section's anchor)
};

// One plot: the JSON object web/report.js draws, with its "id", its "kind" (hist, timeline,
// rate or split) and that kind's data. The page puts every plot's object, in page order, in
// one data block ({"charts": [...]}). `note` is shown above the plot.
struct Plot {
  nlohmann::json data;
  std::string note;
};

// A heading inside a section (a table's title).
struct Heading {
  std::string text;
};

struct Table {
  struct Column {
    std::string name;
    bool key = false;  // a name column: left-aligned, heading and cells alike
  };
  std::vector<Column> columns;
  std::vector<std::vector<std::string>> rows;  // one text per column
};

// Preformatted text (a whole text report), collapsed behind its summary.
struct Details {
  std::string summary;
  std::string text;
};

using Block = std::variant<Note, Plot, Heading, Table, Details>;

struct Section {
  std::string id;       // the anchor is "s-<id>"
  std::string heading;  // also its link in the page's navigation
  std::vector<Block> blocks;
};

struct Page {
  std::string title;
  std::vector<Note> meta;  // under the title, before the navigation
  std::vector<Section> sections;
};

// The self-contained document of `page` (html_report_page.cc).
std::string RenderPage(const Page& page);

}  // namespace exitscope::report::html
