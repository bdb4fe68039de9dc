//! Software clock synchronisation in the style of Huygens (NSDI'18). Being
//! built (probe-mesh issue).
