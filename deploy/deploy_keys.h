#pragma once
// Internal to deploy/: the deployment file's key table (deploy_keys.cpp), one row per key
// in reference-page order. Its applicability names the role kinds, in RoleKind order.
#include "deploy/deploy_config.h"
#include "key_table/key_table.h"

namespace dsactor::deploy {

const key_table::KeyTable& deploy_key_table();
// The bit of `kind` in KeySpec::applies_to.
size_t role_index(RoleKind kind);

}  // namespace dsactor::deploy
