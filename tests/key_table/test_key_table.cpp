// The key-table engine on a small table of its own: paths, lookups, the words of errors,
// byte sizes and the reference page. The config readers' own tests (tests/config,
// tests/deploy) check the engine through real files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "key_table/byte_size.h"
#include "key_table/key_error.h"
#include "key_table/key_path.h"
#include "key_table/key_suggestion.h"
#include "key_table/key_table.h"
#include "key_table/reference_markdown.h"

namespace dsactor::key_table {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr unsigned kA = 1u << 0;
constexpr unsigned kB = 1u << 1;

const std::vector<KeySpec>& rows() {
  static const std::vector<KeySpec> r = {
      {.path = "name", .type = ValueType::kString, .doc = "the name", .default_doc = "required"},
      {.path = "size",
       .type = ValueType::kBytes,
       .def = int_value(int64_t{1} << 20),
       .doc = "size"},
      {.path = "items", .type = ValueType::kObjectList, .doc = "the items", .section = "Items"},
      {.path = "items[].kind",
       .type = ValueType::kEnum,
       .choices = {"apple", "pear"},
       .unsupported = {"plum"},
       .doc = "what it is"},
      {.path = "items[].count",
       .type = ValueType::kInt,
       .def = int_value(1),
       .min = 1,
       .max = 9,
       .doc = "how many",
       .applies_to = kA},
      {.path = "items[].color",
       .type = ValueType::kString,
       .doc = "a | separated list",
       .applies_to = kB},
      {.path = "items[].colour", .type = ValueType::kString, .alias_of = "items[].color"},
  };
  return r;
}

const KeyTable& table() {
  static const KeyTable t = KeyTable::of(rows(), {"variety", "varieties", {"A", "B"}});
  return t;
}

TEST(KeyPath, ParentsLeavesAndIndices) {
  EXPECT_EQ(parent_of("a.b.c"), "a.b");
  EXPECT_EQ(parent_of("job"), "");
  EXPECT_EQ(leaf_of("roles[1].name"), "name");
  EXPECT_EQ(join_path("", "x"), "x");
  EXPECT_EQ(join_path("roles[1]", "x"), "roles[1].x");
  EXPECT_EQ(template_path("roles[12].aio.x"), "roles[].aio.x");
  EXPECT_EQ(render_path("roles[].aio.block_size", "roles[2]"), "roles[2].aio.block_size");
  EXPECT_EQ(render_path("roles[].listen", ""), "roles[].listen");
  EXPECT_EQ(render_path("zero.stage", ""), "zero.stage");
}

TEST(KeyTableLookup, FindsRowsByPathWhateverTheIndex) {
  EXPECT_EQ(table().find("items[3].count"), &rows()[4]);
  EXPECT_EQ(table().find("nope"), nullptr);
  EXPECT_EQ(table().children("items[0]").size(), 4u);  // the alias counts as a key
  EXPECT_EQ(table().child("", "size"), &rows()[1]);
  ASSERT_EQ(table().aliases_of(rows()[5]).size(), 1u);
  EXPECT_EQ(table().index_of(rows()[2]), 2u);
}

TEST(KeyTableErrors, UnknownKeyNamesTheNearestKeyAsAPath) {
  EXPECT_EQ(table().unknown_key_problem("items[1]", "cuont"),
            "unknown key (did you mean \"items[1].count\"?); keys allowed in items[1]: kind, "
            "count, color, colour");
  // No sibling is close: a key of that name elsewhere is the hint.
  EXPECT_THAT(table().unknown_key_problem("", "kind"),
              HasSubstr("(did you mean \"items[].kind\"?); keys allowed at the top level"));
  EXPECT_THAT(table().unknown_key_problem("", "zzzzzz"), Not(HasSubstr("did you mean")));
}

TEST(KeyTableErrors, KeyOfAnotherVariety) {
  EXPECT_TRUE(table().applies(rows()[4], 0));
  EXPECT_FALSE(table().applies(rows()[4], 1));
  EXPECT_TRUE(table().applies(rows()[3], 1));
  EXPECT_EQ(table().not_applicable_problem(rows()[4], 1),
            "key \"count\" applies to variety A, not to variety B; B takes: kind, color");
}

TEST(KeyErrorWords, LocationsAndValues) {
  EXPECT_EQ((Location{"f.yaml", 3}.message("a.b", "bad")), "f.yaml:3: a.b: bad");
  EXPECT_EQ((Location{"f.json"}.message("a", "bad")), "f.json: a: bad");
  EXPECT_EQ((Location{"f.yaml", 1}.message("", "bad")), "f.yaml:1: bad");
  const KeySpec& count = rows()[4];
  EXPECT_EQ(not_allowed_problem(count, "\"12\""),
            "value \"12\" is not allowed; expected an integer in [1, 9]");
  EXPECT_EQ(not_allowed_problem(count, "5", Range{.min = 0, .max = 3}),
            "value 5 is not allowed; expected an integer in [0, 3]");
  EXPECT_EQ(expected_problem(rows()[0], "a list"), "expected a string, got a list");
  const KeySpec& kind = rows()[3];
  EXPECT_EQ(match_choice(kind, "pear"), "pear");
  EXPECT_FALSE(match_choice(kind, "Pear").has_value());  // not icase
  EXPECT_THAT(choice_problem(kind, "paer"), HasSubstr("(did you mean \"pear\"?)"));
  EXPECT_THAT(choice_problem(kind, "plum"), HasSubstr("does not support"));
}

TEST(Ranges, TextAndContains) {
  EXPECT_EQ((Range{.min = 0, .max = 86400, .min_exclusive = true}.text()), " in (0, 86400]");
  EXPECT_EQ((Range{.min = 1}.text()), " >= 1");
  EXPECT_EQ((Range{.min = 0, .min_exclusive = true}.text()), " > 0");
  EXPECT_FALSE((Range{.min = 0, .min_exclusive = true}.contains(0)));
  EXPECT_TRUE((Range{.min = 0, .max = 1}.contains(1)));
}

TEST(ByteSize, SuffixesAndRefusals) {
  EXPECT_EQ(parse_byte_size("4096"), 4096u);
  EXPECT_EQ(parse_byte_size("64GiB"), uint64_t{64} << 30);
  EXPECT_EQ(parse_byte_size("64G"), uint64_t{64} << 30);
  EXPECT_EQ(parse_byte_size("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("512 mib"), uint64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("4GB"), uint64_t{4000000000});
  EXPECT_EQ(parse_byte_size("1.5KiB"), 1536u);
  EXPECT_EQ(parse_byte_size("1TiB"), uint64_t{1} << 40);
  EXPECT_FALSE(parse_byte_size("1.3B").has_value());  // not a whole number of bytes
  EXPECT_FALSE(parse_byte_size("GiB").has_value());
  EXPECT_FALSE(parse_byte_size("-1").has_value());
  EXPECT_FALSE(parse_byte_size("99999999999999999999").has_value());
  EXPECT_FALSE(parse_byte_size("20000000TiB").has_value());  // overflows 64 bits
}

TEST(ByteSize, TextReadsBack) {
  for (uint64_t v : {uint64_t{0}, uint64_t{1000}, uint64_t{4096}, uint64_t{1} << 20,
                     uint64_t{64} << 30, uint64_t{3} << 40, uint64_t{1536}})
    EXPECT_EQ(parse_byte_size(byte_size_text(v)), v) << byte_size_text(v);
  EXPECT_EQ(byte_size_text(uint64_t{64} << 30), "64GiB");
  EXPECT_EQ(byte_size_text(1536), "1536");  // 1.5KiB is not a whole number of KiB
  EXPECT_EQ(byte_size_text(0), "0");
}

TEST(Suggestion, NearestKeyIsCaseInsensitiveAndBounded) {
  EXPECT_EQ(nearest_key("STAGE", {"stage", "steps"}), "stage");
  EXPECT_FALSE(nearest_key("completely_different", {"stage"}).has_value());
  EXPECT_EQ(did_you_mean("trainr", {"offload", "trainer"}), " (did you mean \"trainer\"?)");
  EXPECT_EQ(did_you_mean("zzz", {"offload"}), "");
}

TEST(ReferencePage, SectionsColumnsAliasesAndEscapes) {
  const std::string md = reference_markdown(table(), "# T\n");
  EXPECT_THAT(md, HasSubstr("# T\n\n## Top level\n\n| key | default | allowed | description |"));
  EXPECT_THAT(md, HasSubstr("| `size` | 1MiB | a byte count"));
  EXPECT_THAT(md, HasSubstr("| `items` |  | a list of objects | the items See `items` below. |"));
  EXPECT_THAT(md, HasSubstr("\n## Items\n\nthe items\n\n| key | varieties | default |"));
  EXPECT_THAT(md, HasSubstr("| `kind` | all | none | one of \"apple\", \"pear\" |"));
  EXPECT_THAT(md, HasSubstr("| `count` | A | 1 | an integer in [1, 9] | how many |"));
  EXPECT_THAT(md, HasSubstr("a \\| separated list Also spelled `colour`."));
  EXPECT_THAT(md, Not(HasSubstr("| `colour` |")));
}

// Two applicabilities, each for the keys under its scope: the same bit means another name.
const std::vector<KeySpec>& scoped_rows() {
  static const std::vector<KeySpec> r = {
      {.path = "fruit", .type = ValueType::kObject, .doc = "a fruit"},
      {.path = "fruit.seeds", .type = ValueType::kInt, .doc = "seeds", .applies_to = kA},
      {.path = "tool", .type = ValueType::kObject, .doc = "a tool"},
      {.path = "tool.blade", .type = ValueType::kString, .doc = "blade", .applies_to = kB},
      {.path = "tool.grip",
       .type = ValueType::kBool,
       .doc = "grip",
       .support = Support::kNoEffect,
       .support_note = "always held"},
      {.path = "tool.laser",
       .type = ValueType::kBool,
       .def = bool_value(false),
       .doc = "laser",
       .supported_value = bool_value(false)},
      {.path = "engine",
       .type = ValueType::kObject,
       .doc = "an engine",
       .support = Support::kUnsupported},
  };
  return r;
}

const KeyTable& scoped_table() {
  static const KeyTable t(
      [] {
        std::vector<const KeySpec*> v;
        for (const auto& r : scoped_rows()) v.push_back(&r);
        return v;
      }(),
      std::vector<Applicability>{{"fruit", "fruits", {"apple", "pear"}, "fruit"},
                                 {"tool", "tools", {"knife", "saw"}, "tool"}});
  return t;
}

TEST(KeyTableErrors, EachScopeNamesItsOwnKinds) {
  EXPECT_EQ(scoped_table().applicability("fruit").noun, "fruit");
  EXPECT_EQ(scoped_table().applicability("tool").plural, "tools");
  EXPECT_EQ(scoped_table().applicability("").noun, "");
  EXPECT_EQ(scoped_table().not_applicable_problem(scoped_rows()[1], 1),
            "key \"seeds\" applies to fruit apple, not to fruit pear; pear takes: ");
  EXPECT_EQ(scoped_table().not_applicable_problem(scoped_rows()[3], 0),
            "key \"blade\" applies to tool saw, not to tool knife; knife takes: grip, laser");
  const std::string md = reference_markdown(scoped_table(), "# T\n");
  EXPECT_THAT(md, HasSubstr("| key | fruits | default |"));
  EXPECT_THAT(md, HasSubstr("| `blade` | saw |"));
  EXPECT_THAT(md, Not(HasSubstr("## `engine`")));  // no rows: no section of its own
}

TEST(CompatibilityPage, MarksEveryKey) {
  const std::string md = compatibility_markdown(scoped_table(), "## C\n\n");
  EXPECT_THAT(md, HasSubstr("## C\n\n| key | in dsactor |\n|---|---|\n| `fruit` | supported |"));
  EXPECT_THAT(md, HasSubstr("| `tool.grip` | accepted, no effect: always held |"));
  EXPECT_THAT(md, HasSubstr("| `tool.laser` | supported only as `false`; other values are "
                            "unsupported |"));
  EXPECT_THAT(md, HasSubstr("| `engine` | unsupported |"));
  EXPECT_EQ(support_text(scoped_rows()[4]), "accepted, no effect: always held");
}

}  // namespace
}  // namespace dsactor::key_table
