//! Reviews of pods the engine has already decided about, each recomputing the decision
//! (`Engine::evaluate`) to compare: the validating checks of a pod after every mutator has run and
//! of template ConfigMaps (`validate`, behind `/validate`), and updates to a running pod that an
//! enforced template forbids (`updates`: resizes below its floor, ephemeral containers that target
//! its containers). Above the decision, which never calls them.

pub mod updates;
pub mod validate;
