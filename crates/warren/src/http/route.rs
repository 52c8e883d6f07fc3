//! The route key of a request and the route table (being written).
