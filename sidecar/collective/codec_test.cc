#include "gtest/gtest.h"

TEST(Placeholder, codec) { SUCCEED(); }
