#include "gtest/gtest.h"

TEST(Placeholder, aggregate) { SUCCEED(); }
