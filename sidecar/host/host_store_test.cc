// HostStore opens data dirs made before the artifacts table existed: the table is created and the
// old records are kept.
#include "sidecar/host/host_store.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "sidecar/artifacts/store.h"
#include "state/db.h"

namespace ts::sidecar {
namespace {

TEST(HostStoreTest, OldDataDirGainsTheArtifactsTableAndKeepsItsRecords) {
  char dir_template[] = "/tmp/ts-host-store-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  std::string path = std::string(dir_template) + "/state";
  {
    // The table set of schema version 1 before artifacts.
    state::DbOptions options;
    options.tables = {std::string(kTableShards),
                      std::string(kTableReservations),
                      std::string(kTableWeights),
                      std::string(kTablePendingTxs),
                      std::string(kTableSettlementDrafts),
                      std::string(kTableEvents),
                      std::string(kTableMeta)};
    options.schema_version = kHostSchemaVersion;
    auto db = state::Db::Open(path, options);
    ASSERT_TRUE(db.ok()) << db.status();
    state::WriteBatch batch;
    batch.Put(kTableMeta, kMetaChainId, "old-chain");
    ASSERT_TRUE((*db)->Write(batch).ok());
    state::WriteBatch refused;
    refused.Put(kTableArtifacts, "k", "v");
    EXPECT_FALSE((*db)->Write(refused).ok()) << "the old table set has no artifacts table";
  }
  auto store = HostStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->MetaString(kMetaChainId), "old-chain");
  state::WriteBatch batch;
  batch.Put(kTableArtifacts, "k", "v");
  ASSERT_TRUE((*store)->db().Write(batch).ok());
  EXPECT_EQ(*(*store)->db().Get(kTableArtifacts, "k"), "v");
  store->reset();
  std::system((std::string("rm -rf ") + dir_template).c_str());
}

}  // namespace
}  // namespace ts::sidecar
