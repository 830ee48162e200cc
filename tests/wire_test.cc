#include <gtest/gtest.h>
TEST(Wire, Placeholder) {}
