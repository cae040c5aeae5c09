#pragma once
// A tiny XML parser for tests: enough to prove an SVG is well-formed (balanced tags, quoted
// attributes, only known entities, no stray '<' or '&') and to walk its elements.
#include <cctype>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace keel::testing {

struct XmlNode {
  std::string tag;
  std::map<std::string, std::string> attrs;  // raw (still escaped) values
  std::vector<std::unique_ptr<XmlNode>> children;
  std::string text;  // concatenated character data, raw

  std::string attr(const std::string& name) const {
    auto it = attrs.find(name);
    return it == attrs.end() ? "" : it->second;
  }
  // Every descendant (depth first) with this tag; with class_name, only those of that class.
  void collect(const std::string& want, std::vector<const XmlNode*>& out, const std::string& class_name = "") const {
    for (const auto& c : children) {
      if (c->tag == want && (class_name.empty() || c->attr("class") == class_name)) out.push_back(c.get());
      c->collect(want, out, class_name);
    }
  }
  std::vector<const XmlNode*> all(const std::string& want, const std::string& class_name = "") const {
    std::vector<const XmlNode*> out;
    collect(want, out, class_name);
    return out;
  }
  // The character data of this node and all its descendants, in document order.
  std::string all_text() const {
    std::string out = text;
    for (const auto& c : children) out += c->all_text();
    return out;
  }
};

// Throws std::runtime_error with the offset on the first problem.
inline std::unique_ptr<XmlNode> parse_xml(std::string_view s) {
  size_t i = 0;
  auto fail = [&](const std::string& why) { throw std::runtime_error("XML error at " + std::to_string(i) + ": " + why); };
  auto check_entities = [&](std::string_view text) {
    for (size_t k = 0; k < text.size(); ++k) {
      if (text[k] == '<') fail("raw '<' in text or attribute");
      if (text[k] != '&') continue;
      const size_t semi = text.find(';', k);
      if (semi == std::string_view::npos) fail("unterminated entity");
      const std::string_view e = text.substr(k + 1, semi - k - 1);
      const bool known = e == "amp" || e == "lt" || e == "gt" || e == "quot" || e == "apos" ||
                         (e.size() > 1 && e[0] == '#');
      if (!known) fail("unknown entity &" + std::string(e) + ";");
    }
  };
  auto is_name = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' || c == '.'; };
  auto root = std::make_unique<XmlNode>();
  root->tag = "#document";
  std::vector<XmlNode*> stack = {root.get()};
  while (i < s.size()) {
    if (s[i] != '<') {
      const size_t next = s.find('<', i);
      const std::string_view text = s.substr(i, next == std::string_view::npos ? std::string_view::npos : next - i);
      check_entities(text);
      stack.back()->text += std::string(text);
      i = next == std::string_view::npos ? s.size() : next;
      continue;
    }
    if (s.substr(i, 4) == "<!--") {
      const size_t end = s.find("-->", i);
      if (end == std::string_view::npos) fail("unterminated comment");
      i = end + 3;
      continue;
    }
    if (s.substr(i, 9) == "<!DOCTYPE") {  // HTML pages written as well-formed XML start with one
      const size_t end = s.find('>', i);
      if (end == std::string_view::npos) fail("unterminated doctype");
      i = end + 1;
      continue;
    }
    if (s.substr(i, 2) == "<?") {
      const size_t end = s.find("?>", i);
      if (end == std::string_view::npos) fail("unterminated declaration");
      i = end + 2;
      continue;
    }
    if (s.substr(i, 2) == "</") {
      size_t j = i + 2;
      while (j < s.size() && is_name(s[j])) ++j;
      const std::string name(s.substr(i + 2, j - i - 2));
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size() || s[j] != '>') fail("bad end tag");
      if (stack.size() < 2 || stack.back()->tag != name) fail("end tag </" + name + "> does not match");
      stack.pop_back();
      i = j + 1;
      continue;
    }
    size_t j = i + 1;
    while (j < s.size() && is_name(s[j])) ++j;
    if (j == i + 1) fail("empty tag name");
    auto node = std::make_unique<XmlNode>();
    node->tag = std::string(s.substr(i + 1, j - i - 1));
    bool self_closing = false;
    for (;;) {
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) fail("unterminated tag");
      if (s[j] == '>') {
        ++j;
        break;
      }
      if (s.substr(j, 2) == "/>") {
        j += 2;
        self_closing = true;
        break;
      }
      const size_t n0 = j;
      while (j < s.size() && is_name(s[j])) ++j;
      if (j == n0) fail("bad attribute name");
      const std::string name(s.substr(n0, j - n0));
      if (j >= s.size() || s[j] != '=') fail("attribute " + name + " without value");
      ++j;
      if (j >= s.size() || (s[j] != '"' && s[j] != '\'')) fail("unquoted attribute " + name);
      const char q = s[j++];
      const size_t end = s.find(q, j);
      if (end == std::string_view::npos) fail("unterminated attribute " + name);
      const std::string_view value = s.substr(j, end - j);
      check_entities(value);
      if (node->attrs.count(name)) fail("duplicate attribute " + name);
      node->attrs[name] = std::string(value);
      j = end + 1;
    }
    i = j;
    XmlNode* raw = node.get();
    stack.back()->children.push_back(std::move(node));
    if (!self_closing) stack.push_back(raw);
  }
  if (stack.size() != 1) throw std::runtime_error("unclosed <" + stack.back()->tag + ">");
  if (root->children.size() != 1) throw std::runtime_error("expected one root element");
  return root;
}

// Attributes that hold numbers (or lists of them) in the SVGs keel writes.
inline bool is_numeric_attr(const std::string& name) {
  static const char* names[] = {"x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "width", "height", "points", "d",
                                "font-size", "stroke-width", "opacity", "offset", "viewBox", "transform"};
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

// The first numeric attribute holding "nan" or "inf" (any case), or "" when there is none.
inline std::string find_bad_number(const XmlNode& node) {
  for (const auto& [k, v] : node.attrs) {
    if (!is_numeric_attr(k)) continue;
    std::string low;
    for (char c : v) low += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (low.find("nan") != std::string::npos || low.find("inf") != std::string::npos) return node.tag + " " + k + "=" + v;
  }
  for (const auto& c : node.children) {
    std::string bad = find_bad_number(*c);
    if (!bad.empty()) return bad;
  }
  return "";
}

}  // namespace keel::testing
