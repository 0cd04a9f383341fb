module {
  func.func @__inference_f_13(%arg0: tensor<?x?x16xf32>, %arg1: tensor<16x8xf32>, %arg2: tensor<8xf32>) -> tensor<?x?x8xf32> attributes {allow_soft_placement = false} {
    %cst = stablehlo.constant dense<1.600000e+01> : tensor<f32>
    %cst_0 = stablehlo.constant dense<-0.000000e+00> : tensor<f32>
    %cst_1 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reduce(%arg0 init: %cst_0) applies stablehlo.add across dimensions = [2] : (tensor<?x?x16xf32>, tensor<f32>) -> tensor<?x?xf32>
    %1 = shape.const_shape [8] : tensor<1xindex>
    %2 = shape.const_shape [16, 8] : !shape.shape
    %3 = shape.shape_of %arg0 : tensor<?x?x16xf32> -> tensor<3xindex>
    %4 = shape.shape_of %0 : tensor<?x?xf32> -> tensor<2xindex>
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %c-2 = arith.constant -2 : index
    %head, %tail = "shape.split_at"(%3, %c-2) : (tensor<3xindex>, index) -> (!shape.shape, !shape.shape)
    %5 = shape.concat %head, %tail : !shape.shape, !shape.shape -> !shape.shape
    %6 = shape.to_extent_tensor %5 : !shape.shape -> tensor<3xindex>
    %7 = shape.concat %head, %2 : !shape.shape, !shape.shape -> !shape.shape
    %8 = shape.to_extent_tensor %7 : !shape.shape -> tensor<3xindex>
    %9 = stablehlo.dynamic_broadcast_in_dim %arg0, %6, dims = [0, 1, 2] : (tensor<?x?x16xf32>, tensor<3xindex>) -> tensor<?x?x16xf32>
    %10 = stablehlo.dynamic_broadcast_in_dim %arg1, %8, dims = [1, 2] : (tensor<16x8xf32>, tensor<3xindex>) -> tensor<?x16x8xf32>
    %11 = stablehlo.dot_general %9, %10, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<?x?x16xf32>, tensor<?x16x8xf32>) -> tensor<?x?x8xf32>
    %12 = stablehlo.dynamic_broadcast_in_dim %cst, %4, dims = [] : (tensor<f32>, tensor<2xindex>) -> tensor<?x?xf32>
    %13 = stablehlo.divide %0, %12 : tensor<?x?xf32>
    %14 = shape.shape_of %11 : tensor<?x?x8xf32> -> tensor<3xindex>
    %15 = shape.broadcast %14, %1 : tensor<3xindex>, tensor<1xindex> -> tensor<3xindex>
    %16 = stablehlo.dynamic_broadcast_in_dim %11, %15, dims = [0, 1, 2] : (tensor<?x?x8xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
    %17 = stablehlo.dynamic_broadcast_in_dim %arg2, %15, dims = [2] : (tensor<8xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
    %18 = stablehlo.add %16, %17 : tensor<?x?x8xf32>
    %19 = shape.shape_of %18 : tensor<?x?x8xf32> -> tensor<3xindex>
    %20 = stablehlo.dynamic_broadcast_in_dim %cst_2, %19, dims = [] : (tensor<f32>, tensor<3xindex>) -> tensor<?x?x8xf32>
    %21 = stablehlo.maximum %18, %20 : tensor<?x?x8xf32>
    %22 = stablehlo.reduce(%21 init: %cst_1) applies stablehlo.maximum across dimensions = [2] : (tensor<?x?x8xf32>, tensor<f32>) -> tensor<?x?xf32>
    %dim = tensor.dim %22, %c0 : tensor<?x?xf32>
    %dim_3 = tensor.dim %22, %c1 : tensor<?x?xf32>
    %from_elements = tensor.from_elements %dim, %dim_3, %c1 : tensor<3xindex>
    %dim_4 = tensor.dim %13, %c0 : tensor<?x?xf32>
    %dim_5 = tensor.dim %13, %c1 : tensor<?x?xf32>
    %from_elements_6 = tensor.from_elements %dim_4, %dim_5, %c1 : tensor<3xindex>
    %23 = stablehlo.dynamic_reshape %22, %from_elements : (tensor<?x?xf32>, tensor<3xindex>) -> tensor<?x?x1xf32>
    %24 = stablehlo.dynamic_reshape %13, %from_elements_6 : (tensor<?x?xf32>, tensor<3xindex>) -> tensor<?x?x1xf32>
    %25 = shape.shape_of %21 : tensor<?x?x8xf32> -> tensor<3xindex>
    %26 = shape.cstr_broadcastable %25, %from_elements : tensor<3xindex>, tensor<3xindex>
    %27 = shape.assuming %26 -> (tensor<?x?x8xf32>) {
      %37 = shape.shape_of %21 : tensor<?x?x8xf32> -> tensor<3xindex>
      %38 = shape.broadcast %37, %from_elements : tensor<3xindex>, tensor<3xindex> -> tensor<3xindex>
      %39 = stablehlo.dynamic_broadcast_in_dim %21, %38, dims = [0, 1, 2] : (tensor<?x?x8xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
      %40 = stablehlo.dynamic_broadcast_in_dim %23, %38, dims = [0, 1, 2] : (tensor<?x?x1xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
      %41 = stablehlo.subtract %39, %40 : tensor<?x?x8xf32>
      shape.assuming_yield %41 : tensor<?x?x8xf32>
    }
    %28 = stablehlo.exponential %27 : tensor<?x?x8xf32>
    %29 = stablehlo.reduce(%28 init: %cst_0) applies stablehlo.add across dimensions = [2] : (tensor<?x?x8xf32>, tensor<f32>) -> tensor<?x?xf32>
    %dim_7 = tensor.dim %29, %c0 : tensor<?x?xf32>
    %dim_8 = tensor.dim %29, %c1 : tensor<?x?xf32>
    %from_elements_9 = tensor.from_elements %dim_7, %dim_8, %c1 : tensor<3xindex>
    %30 = stablehlo.dynamic_reshape %29, %from_elements_9 : (tensor<?x?xf32>, tensor<3xindex>) -> tensor<?x?x1xf32>
    %31 = shape.shape_of %28 : tensor<?x?x8xf32> -> tensor<3xindex>
    %32 = shape.cstr_broadcastable %31, %from_elements_9 : tensor<3xindex>, tensor<3xindex>
    %33 = shape.assuming %32 -> (tensor<?x?x8xf32>) {
      %37 = shape.shape_of %28 : tensor<?x?x8xf32> -> tensor<3xindex>
      %38 = shape.broadcast %37, %from_elements_9 : tensor<3xindex>, tensor<3xindex> -> tensor<3xindex>
      %39 = stablehlo.dynamic_broadcast_in_dim %28, %38, dims = [0, 1, 2] : (tensor<?x?x8xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
      %40 = stablehlo.dynamic_broadcast_in_dim %30, %38, dims = [0, 1, 2] : (tensor<?x?x1xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
      %41 = stablehlo.divide %39, %40 : tensor<?x?x8xf32>
      shape.assuming_yield %41 : tensor<?x?x8xf32>
    }
    %34 = shape.shape_of %33 : tensor<?x?x8xf32> -> tensor<3xindex>
    %35 = shape.cstr_broadcastable %34, %from_elements_6 : tensor<3xindex>, tensor<3xindex>
    %36 = shape.assuming %35 -> (tensor<?x?x8xf32>) {
      %37 = shape.shape_of %33 : tensor<?x?x8xf32> -> tensor<3xindex>
      %38 = shape.broadcast %37, %from_elements_6 : tensor<3xindex>, tensor<3xindex> -> tensor<3xindex>
      %39 = stablehlo.dynamic_broadcast_in_dim %33, %38, dims = [0, 1, 2] : (tensor<?x?x8xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
      %40 = stablehlo.dynamic_broadcast_in_dim %24, %38, dims = [0, 1, 2] : (tensor<?x?x1xf32>, tensor<3xindex>) -> tensor<?x?x8xf32>
      %41 = stablehlo.multiply %39, %40 : tensor<?x?x8xf32>
      shape.assuming_yield %41 : tensor<?x?x8xf32>
    }
    return %36 : tensor<?x?x8xf32>
  }
}
